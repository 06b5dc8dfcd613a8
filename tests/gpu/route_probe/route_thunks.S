# The tracer's thunks (route_probe.c): 4096 entries of 16 bytes, entry i loads i into r11 and jumps
# to probe_common, which saves the argument registers, logs call i, restores them and tail-jumps to
# probe_targets[i] with the caller's return address still on the stack.
        .text
        .globl  probe_thunk_base
        .hidden probe_thunk_base
        .p2align 4
probe_thunk_base:
        .set    n, 0
        .rept   4096
        .p2align 4
        movl    $n, %r11d
        jmp     probe_common
        .set    n, n+1
        .endr
probe_common:
        pushq   %rbp
        movq    %rsp, %rbp
        subq    $192, %rsp
        movq    %rdi, 0(%rsp)
        movq    %rsi, 8(%rsp)
        movq    %rdx, 16(%rsp)
        movq    %rcx, 24(%rsp)
        movq    %r8, 32(%rsp)
        movq    %r9, 40(%rsp)
        movq    %rax, 48(%rsp)
        movq    %r11, 56(%rsp)
        movdqu  %xmm0, 64(%rsp)
        movdqu  %xmm1, 80(%rsp)
        movdqu  %xmm2, 96(%rsp)
        movdqu  %xmm3, 112(%rsp)
        movdqu  %xmm4, 128(%rsp)
        movdqu  %xmm5, 144(%rsp)
        movdqu  %xmm6, 160(%rsp)
        movdqu  %xmm7, 176(%rsp)
        movq    %r11, %rdi
        call    probe_log_call
        movq    0(%rsp), %rdi
        movq    8(%rsp), %rsi
        movq    16(%rsp), %rdx
        movq    24(%rsp), %rcx
        movq    32(%rsp), %r8
        movq    40(%rsp), %r9
        movq    48(%rsp), %rax
        movq    56(%rsp), %r11
        movdqu  64(%rsp), %xmm0
        movdqu  80(%rsp), %xmm1
        movdqu  96(%rsp), %xmm2
        movdqu  112(%rsp), %xmm3
        movdqu  128(%rsp), %xmm4
        movdqu  144(%rsp), %xmm5
        movdqu  160(%rsp), %xmm6
        movdqu  176(%rsp), %xmm7
        leaq    probe_targets(%rip), %r10
        movq    (%r10,%r11,8), %r11
        leave
        jmp     *%r11
        .section .note.GNU-stack,"",@progbits
