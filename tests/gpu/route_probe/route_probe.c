/* LD_PRELOAD tracer, run without allocshim: logs every driver entry point the CUDA runtime resolves
 * (dlsym on libcuda, cuGetProcAddress and cuGetProcAddress_v2, cuGetExportTable) with the version
 * and flags asked, then every call made through the pointers it handed out, so that what a runtime
 * call such as cudaDeviceReset reaches is visible. Each resolved entry point is replaced by a thunk
 * (route_thunks.S) that logs its name and tail-jumps to the real one. With PROBE_WRAP_EXPORT set,
 * the function pointers of export tables are wrapped too (a guess at their layout: it may break
 * the runtime). The program can call probe_mark("...") (found with dlsym) to mark phases.
 *
 *   PROBE_LOG=trace.log LD_PRELOAD=.../libroute_probe.so ./reset_probe
 *
 * A diagnostic, not part of the shim: dlsym(RTLD_NEXT, ...) from the program is not forwarded with
 * the caller's address (abi/dlsym.S does that for the shim). Results:
 * tests/gpu/results/h100-2026-11-25-reset-route.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <unistd.h>

#define MAX_THUNKS 4096
__attribute__((visibility("hidden"))) void* probe_targets[MAX_THUNKS];
static char names[MAX_THUNKS][80];
static int count;
extern char probe_thunk_base[];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int fd = 2;
static uintptr_t x_lo, x_hi;

static void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 1) n = sizeof buf - 1;
  ssize_t w = write(fd, buf, (size_t)n);
  (void)w;
}

__attribute__((visibility("hidden"))) void probe_log_call(long i) { say("call %s\n", names[i]); }

void probe_mark(const char* s) { say("=== %s\n", s); }

static void* thunk_for(const char* name, void* real) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < count; ++i)
    if (probe_targets[i] == real) {
      pthread_mutex_unlock(&mu);
      return probe_thunk_base + 16 * i;
    }
  if (count == MAX_THUNKS) {
    pthread_mutex_unlock(&mu);
    return real;
  }
  int i = count++;
  probe_targets[i] = real;
  snprintf(names[i], sizeof names[i], "%s", name);
  pthread_mutex_unlock(&mu);
  return probe_thunk_base + 16 * i;
}

static int find_cuda_x(struct dl_phdr_info* info, size_t sz, void* data) {
  (void)sz;
  (void)data;
  if (!strstr(info->dlpi_name, "libcuda.so")) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* p = &info->dlpi_phdr[i];
    if (p->p_type == PT_LOAD && (p->p_flags & PF_X)) {
      x_lo = info->dlpi_addr + p->p_vaddr;
      x_hi = x_lo + p->p_memsz;
    }
  }
  return 1;
}

typedef int (*gpa2_t)(const char*, void**, int, unsigned long long, int*);
typedef int (*gpa1_t)(const char*, void**, int, unsigned long long);
typedef int (*get_table_t)(const void**, const unsigned char*);
static gpa2_t real_gpa2;
static gpa1_t real_gpa1;
static get_table_t real_get_table;
static int my_gpa2(const char*, void**, int, unsigned long long, int*);
static int my_gpa1(const char*, void**, int, unsigned long long);
static int my_get_table(const void**, const unsigned char*);

static const void* wrap_table(const void* table, const unsigned char* id) {
  static struct {
    const void* orig;
    const void* copy;
  } cache[64];
  static int ncache;
  for (int i = 0; i < ncache; ++i)
    if (cache[i].orig == table) return cache[i].copy;
  if (!x_lo) dl_iterate_phdr(find_cuda_x, NULL);
  const uintptr_t* t = table;
  size_t n = (t[0] < 0x1000 && t[0] % 8 == 0) ? t[0] / 8 : 0;
  if (n == 0) {
    while (n < 64 && t[n] >= x_lo && t[n] < x_hi) ++n;
  }
  if (n == 0 || n > 512) return table;
  uintptr_t* copy = malloc(n * sizeof *copy);
  for (size_t i = 0; i < n; ++i) {
    copy[i] = t[i];
    if (t[i] >= x_lo && t[i] < x_hi) {
      char name[80];
      snprintf(name, sizeof name, "xt:%02x%02x%02x%02x:%zu", id[0], id[1], id[2], id[3], i);
      copy[i] = (uintptr_t)thunk_for(name, (void*)t[i]);
    }
  }
  say("export table %02x%02x%02x%02x: %zu entries wrapped\n", id[0], id[1], id[2], id[3], n);
  if (ncache < 64) {
    cache[ncache].orig = table;
    cache[ncache].copy = copy;
    ++ncache;
  }
  return copy;
}

static int my_get_table(const void** table, const unsigned char* id) {
  int r = real_get_table(table, id);
  say("cuGetExportTable %02x%02x%02x%02x-%02x%02x%02x%02x -> %d\n", id[0], id[1], id[2], id[3],
      id[4], id[5], id[6], id[7], r);
  if (r == 0 && table && *table && getenv("PROBE_WRAP_EXPORT")) *table = wrap_table(*table, id);
  return r;
}

static void* substitute(const char* sym, void* p, const char* how) {
  if (strcmp(sym, "cuGetProcAddress") == 0 || strcmp(sym, "cuGetProcAddress_v2") == 0) {
    if (p == (void*)real_gpa2 && real_gpa2) return (void*)my_gpa2;
    if (p == (void*)real_gpa1 && real_gpa1) return (void*)my_gpa1;
    say("unwrapped resolver %s (%s)\n", sym, how);
    return p;
  }
  if (strcmp(sym, "cuGetExportTable") == 0) {
    real_get_table = (get_table_t)p;
    return (void*)my_get_table;
  }
  return thunk_for(sym, p);
}

static int my_gpa2(const char* sym, void** pfn, int ver, unsigned long long flags, int* status) {
  int r = real_gpa2(sym, pfn, ver, flags, status);
  say("resolve2 %s ver %d flags %llu -> %d status %d\n", sym, ver, flags, r, status ? *status : -1);
  if (r == 0 && pfn && *pfn) *pfn = substitute(sym, *pfn, "gpa2");
  return r;
}
static int my_gpa1(const char* sym, void** pfn, int ver, unsigned long long flags) {
  int r = real_gpa1(sym, pfn, ver, flags);
  say("resolve1 %s ver %d flags %llu -> %d\n", sym, ver, flags, r);
  if (r == 0 && pfn && *pfn) *pfn = substitute(sym, *pfn, "gpa1");
  return r;
}

static void* (*real_dlsym)(void*, const char*);
void* dlsym(void* h, const char* name) {
  if (!real_dlsym) {
    real_dlsym = (void* (*)(void*, const char*))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
      real_dlsym = (void* (*)(void*, const char*))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    const char* path = getenv("PROBE_LOG");
    if (path) {
      FILE* f = fopen(path, "a");  // kept open for the process's life
      if (f) fd = fileno(f);
    }
  }
  void* p = real_dlsym(h, name);
  if (!p || name[0] != 'c' || name[1] != 'u' || !(name[2] >= 'A' && name[2] <= 'Z')) return p;
  say("dlsym %s\n", name);
  if (strcmp(name, "cuGetProcAddress_v2") == 0) {
    real_gpa2 = (gpa2_t)p;
    return (void*)my_gpa2;
  }
  if (strcmp(name, "cuGetProcAddress") == 0) {
    real_gpa1 = (gpa1_t)p;
    return (void*)my_gpa1;
  }
  return substitute(name, p, "dlsym");
}
