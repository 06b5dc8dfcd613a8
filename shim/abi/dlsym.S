# The dlsym override, in assembly because of RTLD_NEXT.
#
# glibc resolves dlsym(RTLD_NEXT, name) relative to the object that *called* dlsym, found from the
# return address. A C wrapper calling the real dlsym would make the shim the caller, and the program
# (or another interposer) would get the wrong "next" definition. So RTLD_NEXT lookups tail-jump to
# glibc's dlsym with the caller's return address still on the stack. Every other handle goes to
# allocshim_dlsym_handle (interpose.cpp), which may substitute a hooked libcuda entry point.
        .text
        .globl  dlsym
        .type   dlsym, @function
dlsym:
        .cfi_startproc
        cmpq    $-1, %rdi                  # RTLD_NEXT is ((void *) -1l)
        jne     allocshim_dlsym_handle
        movq    allocshim_real_dlsym_ptr(%rip), %rax
        testq   %rax, %rax
        jz      1f
        jmp     *%rax
1:      pushq   %rdi                       # first call: find glibc's dlsym, keeping the arguments
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp                   # keep the stack 16-byte aligned at the call
        .cfi_adjust_cfa_offset 8
        call    allocshim_load_real_dlsym
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jz      2f
        jmp     *%rax
2:      ret                                # no dlsym in libc: return NULL
        .cfi_endproc
        .size   dlsym, .-dlsym
        .section .note.GNU-stack,"",@progbits
