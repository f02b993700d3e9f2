# The CUDA backend's tests on an emulated GPU (tests/cuda_sim/, cudasim): the backend's own
# sources, its kernels (src/kernels/cuda/*.cu, rewritten to host C++ by cudasim_rewrite_launches)
# and the CUDA tests (tests/cuda/ but the NCCL ones) compiled by the host compiler against
# tests/cuda_sim/include, whose cuda_runtime.h, cuda_bf16.h, mma.h, CUB sort and cuBLAS /
# cuBLASLt stand in for the toolkit's. Needs no toolkit, so every build of the tests has it: the
# device code runs on every machine. What it does and does not show: tests/cuda_sim/README.md.
add_executable(cudasim_rewrite_launches tests/cuda_sim/rewrite_launches.cpp)
target_compile_options(cudasim_rewrite_launches PRIVATE ${MOECORE_WARNINGS})

# The backend's kernels, and the kernels of the emulator's own tests (tests/cuda_sim/*.cu).
file(GLOB MOECORE_SIM_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cu
     ${CMAKE_SOURCE_DIR}/src/dist/nccl/*.cu ${CMAKE_SOURCE_DIR}/tests/cuda_sim/*.cu)
set(MOECORE_SIM_REWRITTEN)
foreach(kernel_file ${MOECORE_SIM_KERNELS})
  get_filename_component(kernel_name ${kernel_file} NAME_WE)
  set(rewritten ${CMAKE_BINARY_DIR}/cuda_sim/${kernel_name}.cu.cpp)
  add_custom_command(OUTPUT ${rewritten}
                     COMMAND cudasim_rewrite_launches ${kernel_file} ${rewritten}
                     DEPENDS ${kernel_file} cudasim_rewrite_launches
                     COMMENT "cudasim: ${kernel_name}.cu as host C++" VERBATIM)
  list(APPEND MOECORE_SIM_REWRITTEN ${rewritten})
endforeach()
# Each kernel file compiles alone in a unity build: the kernels are written for nvcc, one file per
# translation unit, and share names in their anonymous namespaces (kThreads, kFullMask).
set_source_files_properties(${MOECORE_SIM_REWRITTEN} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

file(GLOB MOECORE_SIM_HOST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cpp
     ${CMAKE_SOURCE_DIR}/src/dist/nccl/*.cpp)
# The emulated GPU with the backend on it, once for the two programs below: the test program and
# the command line.
add_library(moecore_cuda_sim_backend OBJECT
            ${MOECORE_SIM_REWRITTEN} ${MOECORE_SIM_HOST_SOURCES}
            tests/cuda_sim/sim_runtime.cpp tests/cuda_sim/sim_executor.cpp
            tests/cuda_sim/cublas_sim.cpp tests/cuda_sim/nccl_sim.cpp
            tests/cuda_sim/nccl_sim_transport.cpp tests/cuda_sim/nccl_sim_symmetric.cpp)
# NCCL's communicator with its device API (nccl_block_exchange.*), over cudasim's NCCL.
target_compile_definitions(moecore_cuda_sim_backend PUBLIC MOECORE_NCCL_DEVICE_API=1)
# The emulated toolkit's headers ahead of any toolkit's (a real one's must not be found instead).
target_include_directories(moecore_cuda_sim_backend BEFORE PUBLIC
                           ${CMAKE_SOURCE_DIR}/tests/cuda_sim/include)
target_include_directories(moecore_cuda_sim_backend PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda_sim)
# No FMA contraction (MOECORE_ENGINE_FP_FLAGS): the device rounds each of __fmul_rn's and
# __fadd_rn's results, and the kernels' plain expressions are what nvcc would contract only where
# the CPU reference does too. nvcc's `#pragma unroll` means nothing to the host compiler.
target_compile_options(moecore_cuda_sim_backend PUBLIC ${MOECORE_ENGINE_FP_FLAGS}
                       -Wno-unknown-pragmas)
target_compile_options(moecore_cuda_sim_backend PRIVATE ${MOECORE_WARNINGS})
target_link_libraries(moecore_cuda_sim_backend PUBLIC moecore_dist moecore_kernels)

file(GLOB MOECORE_SIM_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/*.cpp)
list(FILTER MOECORE_SIM_TEST_SOURCES EXCLUDE REGEX "/tests/cuda/main\\.cpp$")
add_executable(moecore_cuda_sim_tests
               ${MOECORE_SIM_TEST_SOURCES} tests/cuda_sim/main.cpp tests/cuda_sim/test_emulator.cpp
               tests/cuda_sim/test_nccl_emulator.cpp tests/cuda_sim/test_block_scaled_gemm.cpp
               tests/cuda_sim/test_sync_each_op.cpp)
target_include_directories(moecore_cuda_sim_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests/cpp
                           ${CMAKE_SOURCE_DIR}/tests/cuda ${CMAKE_SOURCE_DIR}/tests/cuda_sim)
moecore_test_code(moecore_cuda_sim_tests)
target_link_libraries(moecore_cuda_sim_tests PRIVATE moecore_cuda_sim_backend moecore_train
                      moecore_kernel_op_cases GTest::gtest)

# The moecore program on the emulated GPU: `train --device cuda`, `diff --b-set
# train.device=cuda`, `devices` and the rest run the backend's kernels and NCCL's communicator
# here, as scripts/gpu_check.sh runs them on the H200 (tests/train/test_cuda_sim_program.py).
add_executable(moecore_cuda_sim ${MOECORE_CLI_DEVICES})
target_compile_definitions(moecore_cuda_sim PRIVATE MOECORE_CLI_HAS_CUDA=1 MOECORE_CLI_HAS_NCCL=1)
target_compile_options(moecore_cuda_sim PRIVATE ${MOECORE_WARNINGS} ${MOECORE_ENGINE_FP_FLAGS})
target_link_libraries(moecore_cuda_sim PRIVATE moecore_cli moecore_cuda_sim_backend)

# The CUDA GEMM benchmark (bench/cuda/gemm.cpp, which scripts/gpu_check.sh runs on the H200) at a
# sixteenth of its sizes (--quick): its code runs in `make test`; its figures mean nothing here.
add_executable(moecore_bench_cuda_gemm_sim bench/cuda/gemm.cpp)
target_compile_options(moecore_bench_cuda_gemm_sim PRIVATE ${MOECORE_WARNINGS})
target_link_libraries(moecore_bench_cuda_gemm_sim PRIVATE moecore_cuda_sim_backend)

# Two entries, so that ctest runs them side by side: the per-op harness, and the backend's own
# tests with the captured training steps. Left out: the one test of the stream's asynchrony
# (CudaPhaseClock's bound on the host's time to issue 30 ms of stream work: cudasim runs work when
# it is issued). Not in the sanitizers' ctest: there the suite takes about four minutes (the
# captured bf16 steps alone two), too much of `make test`'s budget; that preset defines the
# program without building it, for a run by hand (`--target moecore_cuda_sim_tests`,
# tests/cuda_sim/README.md).
# Also left out, by name, the cases that cannot run here: the CUDA backend has no T x T causal
# attention (its attention is the flash pair, whose case runs), and cudasim gives a process one GPU,
# so the one-process two-GPU NCCL cases (ncclCommInitAll) run as their two-process twins in
# CudaSim.TwoRanks. Every other case must run: a skip fails the entry, as 0 tests run does.
if(NOT MOECORE_SANITIZE)
  set(MOECORE_SIM_NOT_RUN
      "CudaPhaseClock.TimesWhatTheStreamRanNotWhatTheHostIssued:Backends/KernelOps.CausalAttentionMatchesReference/cuda:NcclCommunicator.TwoGpus*:NcclBlockExchange.TwoGpus*")
  add_test(NAME CudaSim.KernelOps
           COMMAND moecore_cuda_sim_tests --gtest_filter=Backends/*-${MOECORE_SIM_NOT_RUN})
  # Also left out here: the one-process training jobs on NCCL (NcclTrainingJob.*, 17 s), whose
  # groups of one move nothing: the two-process jobs below run the same paths and move their data.
  add_test(NAME CudaSim.Backend
           COMMAND moecore_cuda_sim_tests
                   --gtest_filter=-Backends/*:*ranks2*:NcclTrainingJob.*:${MOECORE_SIM_NOT_RUN})
  # NCCL's communicator, its symmetric exchange and the training job over them in two processes,
  # each with a GPU of its own, joined by cudasim's NCCL (nccl_sim.cpp); a case that skips there
  # fails the entry. A rank that waits 120 s for its peer with nothing moving ends the run (a
  # step's kernels take seconds here), so a hang costs CI two minutes, not ctest's timeout.
  add_test(NAME CudaSim.TwoRanks
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
                   $<TARGET_FILE:moecore_cuda_sim_tests> --gtest_filter=*ranks2*)
  # The MX GEMMs on an emulated Blackwell (CUDASIM_ARCH=sm_100): cuBLASLt's block-scaled FP8
  # GEMM, which the backend takes there and no GPU of the project has run (cublas_sim.cpp). The
  # per-op harness's MX cases and the captured MX expert GEMMs, failing unless block-scaled GEMMs
  # ran among them (the process counts them at exit); and the emulation's own checks apart, so
  # that their GEMMs do not make that count.
  add_test(NAME CudaSim.Blackwell
           COMMAND moecore_cuda_sim_tests
                   --gtest_filter=Backends/MxKernelOps.*:CudaGraphStep.TheMx*)
  add_test(NAME CudaSim.BlackwellEmulation
           COMMAND moecore_cuda_sim_tests --gtest_filter=CudasimBlockScaled.*)
  set_tests_properties(CudaSim.Blackwell CudaSim.BlackwellEmulation PROPERTIES
                       ENVIRONMENT "CUDASIM_ARCH=sm_100;OMP_WAIT_POLICY=PASSIVE"
                       FAIL_REGULAR_EXPRESSION "FAILED|SKIPPED \\]|cudasim: 0 block-scaled GEMMs ran|cudasim: cudaError")
  # MOECORE_CUDA_SYNC_EACH_OP read from the environment (src/kernels/cuda/runtime.h): the one test
  # that holds the switch to the variable, in a process where the variable is set.
  add_test(NAME CudaSim.SyncEachOpFromTheEnvironment
           COMMAND moecore_cuda_sim_tests --gtest_filter=CudasimSyncEachOp.TheEnvironmentSetsTheSwitch)
  set_tests_properties(CudaSim.SyncEachOpFromTheEnvironment PROPERTIES
                       ENVIRONMENT "MOECORE_CUDA_SYNC_EACH_OP=1")
  add_test(NAME CudaSim.GemmBench
           COMMAND moecore_bench_cuda_gemm_sim --quick
                   --json ${CMAKE_BINARY_DIR}/cuda_sim/gemm_bench.json)
  set_tests_properties(CudaSim.GemmBench PROPERTIES FAIL_REGULAR_EXPRESSION "cudasim: cudaError")
  # COST: the longest entries of the suite, started first so that they do not end it alone.
  set_tests_properties(CudaSim.KernelOps CudaSim.Backend CudaSim.TwoRanks PROPERTIES
                       ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE" COST 1000
                       FAIL_REGULAR_EXPRESSION "SKIPPED \\]|Running 0 tests|cudasim: cudaError(LaunchFailure|IllegalAddress)")
  set_tests_properties(CudaSim.TwoRanks PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMP_WAIT_POLICY=PASSIVE;CUDASIM_NCCL_TIMEOUT_S=120"
      FAIL_REGULAR_EXPRESSION "FAILED|SKIPPED \\]|cudasim: cudaError(LaunchFailure|IllegalAddress)|cudasim: NCCL")
endif()
