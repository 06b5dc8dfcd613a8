# Included from tools/bench/CMakeLists.txt at the end of the top-level directory (deferred), so the
# targets and tests below belong to that directory; paths are taken from this file's folder.
set(ALLOCSHIM_BENCH_DIR ${CMAKE_CURRENT_LIST_DIR})

get_property(_allocshim_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if(CUDA IN_LIST _allocshim_languages)
  # nvcc's defaults, as a program built with a plain `nvcc` would be: the CUDA runtime linked
  # statically, which reaches the driver through dlopen + cuGetProcAddress.
  add_executable(alloc_latency ${ALLOCSHIM_BENCH_DIR}/alloc_latency.cu)
  set_target_properties(alloc_latency PROPERTIES CUDA_RUNTIME_LIBRARY Static CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(alloc_latency PRIVATE Threads::Threads)
  target_include_directories(alloc_latency PRIVATE ${PROJECT_SOURCE_DIR})
  # cudart's own cost per call: cudart pairs against the same pairs on the driver API, one process.
  add_executable(cudart_cost ${ALLOCSHIM_BENCH_DIR}/cudart_cost.cu)
  set_target_properties(cudart_cost PROPERTIES CUDA_RUNTIME_LIBRARY Static CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(cudart_cost PRIVATE CUDA::cuda_driver)
  # Threads that allocate, run kernels, synchronize their stream and free (free_sync's cost).
  add_executable(kernel_churn ${ALLOCSHIM_BENCH_DIR}/kernel_churn.cu)
  set_target_properties(kernel_churn PROPERTIES CUDA_RUNTIME_LIBRARY Static CUDA_STANDARD 17
                        CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(kernel_churn PRIVATE Threads::Threads)
  target_include_directories(kernel_churn PRIVATE ${PROJECT_SOURCE_DIR})
  # The GPU benchmark programs of bench.py's sections (README.md there); the headers they share
  # with the GPU suite's programs are in tests/gpu. spill_bench loads NVML at run time. pin_bench
  # and move_bench measure, natively, what pinning host memory and a move cost step by step;
  # host_give_bench a demotion into host pieces another process made; pin_ahead_bench the
  # allocation that demotes after a program computed ([backends.host] pin_ahead); compute_spin is a process
  # of known kernels for [compute] shares.
  foreach(prog IN ITEMS ipc_bench share_bench migrate_bench launch_rate spill_bench pin_bench move_bench
                    host_give_bench pin_ahead_bench compute_spin)
    set(extra)
    if(prog STREQUAL "spill_bench")
      set(extra LIBS ${CMAKE_DL_LIBS})
    elseif(prog MATCHES "^(pin|move|host_give)_bench$")
      set(extra DRIVER)
    endif()
    allocshim_gpu_program(${prog} ${ALLOCSHIM_BENCH_DIR}/${prog}.cu ${extra})
    target_include_directories(${prog} PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu)
  endforeach()
  add_custom_target(allocshim_bench DEPENDS alloc_latency kernel_churn core_overhead allocshim allocshim_preload)

  if(ALLOCSHIM_BUILD_TESTS)
    # A few seconds of each workload on the GPU (SKIPPED without one); the real run is bench.py's
    # alloc section.
    foreach(mode IN ITEMS sync async threads mixed)
      set(args --quick)
      if(mode STREQUAL "async")
        list(APPEND args --async)
      elseif(mode STREQUAL "threads")
        list(APPEND args --threads 1,4)
      elseif(mode STREQUAL "mixed")
        list(APPEND args --mixed)
      endif()
      add_test(NAME bench.alloc_latency.${mode} COMMAND alloc_latency ${args})
      set_tests_properties(bench.alloc_latency.${mode} PROPERTIES LABELS "gpu;bench" SKIP_RETURN_CODE 77
                           RESOURCE_LOCK gpu TIMEOUT 120)
    endforeach()
    add_test(NAME bench.kernel_churn COMMAND kernel_churn --threads 1,4 --iterations 20)
    set_tests_properties(bench.kernel_churn PROPERTIES LABELS "gpu;bench" SKIP_RETURN_CODE 77
                         RESOURCE_LOCK gpu TIMEOUT 120)
  endif()
endif()

# The same program on the host, against a mock CUDA runtime (mock/cuda_runtime.h): alloc_latency
# has no kernels, so its logic can run and be tested without a GPU or nvcc.
add_executable(alloc_latency_mock ${ALLOCSHIM_BENCH_DIR}/alloc_latency_mock.cpp)
target_include_directories(alloc_latency_mock BEFORE PRIVATE ${ALLOCSHIM_BENCH_DIR}/mock)
target_include_directories(alloc_latency_mock PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(alloc_latency_mock PRIVATE Threads::Threads)

if(ALLOCSHIM_BUILD_TESTS)
  # bench.py's parsing, ratios, targets and results.md on recorded output, and whole runs against
  # fakes (alloc_latency on the mock runtime, a fake libcuda.so.1 built by the C compiler for the
  # GPU probe): no GPU needed. python3 from PATH, as on the GPU machine.
  add_test(NAME bench.selftest
           COMMAND python3 ${ALLOCSHIM_BENCH_DIR}/test_bench.py --mock-bench $<TARGET_FILE:alloc_latency_mock>
                   --cc ${CMAKE_C_COMPILER})
  set_tests_properties(bench.selftest PROPERTIES LABELS "bench" TIMEOUT 300)
  # The plots bench.py draws from a results.json (matplotlib); skipped where matplotlib is missing.
  add_test(NAME bench.plots COMMAND python3 ${ALLOCSHIM_BENCH_DIR}/test_plots.py)
  set_tests_properties(bench.plots PROPERTIES LABELS "bench" SKIP_RETURN_CODE 77 TIMEOUT 120)
  # The model zoo's runner (zoo/zoo_run.py: budgets, bounds, goals, merged records; zoo_report.py: the report)
  # against a fake loop: no GPU, torch or JAX needed.
  add_test(NAME bench.zoo_selftest COMMAND python3 ${ALLOCSHIM_BENCH_DIR}/zoo/test_zoo.py)
  set_tests_properties(bench.zoo_selftest PROPERTIES LABELS "bench" TIMEOUT 120)
endif()
