/* Route (f): what the shim must leave alone. Resolver failures come back with the driver's error
 * and symbolStatus; names of other libraries are never redirected; cuGetExportTable passes
 * through with no side effect. */
#include <stdint.h>

#include "prog_util.h"

typedef CUresult (*get_proc_fn)(const char*, void**, int, cuuint64_t,
                                CUdriverProcAddressQueryResult*);
typedef CUresult (*get_proc_v1_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*export_table_fn)(const void**, const CUuuid*);
typedef void* (*self_fn)(const char*);
typedef const void* (*fake_table_fn)(void);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static void expect_not_found(get_proc_fn get_proc, const char* name, int version,
                             CUdriverProcAddressQueryResult expected) {
  void* fn = (void*)(uintptr_t)1;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK_CU_IS(get_proc(name, &fn, version, 0, &status), CUDA_ERROR_NOT_FOUND);
  if (status != expected)
    fprintf(stderr, "%s: status %d, expected %d\n", name, (int)status, (int)expected);
  CHECK(status == expected);
  CHECK(fn == NULL);
}

int main(int argc, char** argv) {
  CHECK(argc == 2); /* the path of preload_cudnn's library */
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  CHECK(cuda != NULL);
  get_proc_fn get_proc = (get_proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  CHECK(get_proc != NULL);

  expect_not_found(get_proc, "cuNoSuchEntryPoint", 13000, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  expect_not_found(get_proc, "cudnnCreate", 13000, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  expect_not_found(get_proc, "cublasCreate", 13000, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  expect_not_found(get_proc, "cuMemAllocAsync", 11000, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  void* fn = (void*)(uintptr_t)1;
  get_proc_v1_fn get_proc_v1 = (get_proc_v1_fn)dlsym(cuda, "cuGetProcAddress");
  CHECK(get_proc_v1 != NULL);
  CHECK_CU_IS(get_proc_v1("cudnnCreate", &fn, 12000, 0), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == NULL);
  CHECK(dlsym(cuda, "cudnnCreate") == NULL);

  /* Another library's cudnn*, cublas* and even cuMemAlloc_v2 stay its own. */
  void* other = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(other != NULL);
  self_fn self = (self_fn)dlsym(other, "preload_cudnn_self");
  CHECK(self != NULL);
  CHECK(dlsym(other, "cudnnCreate") == self("cudnnCreate"));
  CHECK(dlsym(other, "cublasCreate_v2") == self("cublasCreate_v2"));
  CHECK(dlsym(other, "cuMemAlloc_v2") == self("cuMemAlloc_v2"));
  CHECK(dlsym(other, "cuMemAlloc_v2") != dlsym(cuda, "cuMemAlloc_v2"));

  /* cuGetExportTable: one call reaches the driver per program call, with the driver's answer. */
  export_table_fn by_dlsym = (export_table_fn)dlsym(cuda, "cuGetExportTable");
  export_table_fn by_proc = NULL;
  CHECK_CU(get_proc("cuGetExportTable", (void**)&by_proc, 13000, 0, NULL));
  CHECK(by_dlsym != NULL && (void*)by_dlsym == (void*)by_proc);
  fake_table_fn fake_table = (fake_table_fn)dlsym(cuda, "fakecuda_export_table");
  CHECK(fake_table != NULL);
  const unsigned long long before = fake_calls(cuda, "cuGetExportTable");
  const unsigned long long total_before = fake_calls(cuda, "cuInit");
  CUuuid id;
  memset(&id, 0x42, sizeof(id));
  const void* table = NULL;
  CHECK_CU(by_dlsym(&table, &id));
  CHECK(table == fake_table());
  CHECK_CU(by_proc(&table, &id));
  CHECK(fake_calls(cuda, "cuGetExportTable") == before + 2);
  CHECK(fake_calls(cuda, "cuInit") == total_before);

  /* One allocation through the resolver, so the shim has started and writes its stats. */
  alloc_fn alloc = NULL;
  free_fn release = NULL;
  CHECK_CU(get_proc("cuMemAlloc", (void**)&alloc, 12000, 0, NULL));
  CHECK_CU(get_proc("cuMemFree", (void**)&release, 12000, 0, NULL));
  CUdeviceptr p = 0;
  CHECK_CU(alloc(&p, 512));
  CHECK_CU(release(p));
  report("alloc", 1);
  return 0;
}
