# The CUDA backend: the library moecore_kernels_cuda from src/kernels/cuda/ (host code in *.cpp,
# compiled by the host compiler with the project's warnings; kernels and their launchers in *.cu,
# by nvcc). MOECORE_CUDA (CMakeLists.txt) says whether to build it; MOECORE_CUDA_ENABLED says
# whether it is built, MOECORE_NCCL_ENABLED whether NCCL's communicator is built with it (below).
set(MOECORE_CUDA_ENABLED OFF)
set(MOECORE_NCCL_ENABLED OFF)
if(NOT MOECORE_CUDA STREQUAL "OFF")
  # CMake looks for nvcc on the PATH only; the toolkit's default place is not always there.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MOECORE_CUDA_ENABLED ON)
  elseif(MOECORE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOECORE_CUDA=ON, but no working CUDA compiler was found: install the CUDA "
                        "toolkit (/usr/local/cuda) or set CUDACXX to its nvcc")
  elseif(NOT MOECORE_CUDA STREQUAL "AUTO")
    message(FATAL_ERROR "MOECORE_CUDA is '${MOECORE_CUDA}': expected AUTO, ON or OFF")
  endif()
endif()
message(STATUS "moecore: CUDA backend ${MOECORE_CUDA_ENABLED} (MOECORE_CUDA=${MOECORE_CUDA})")

if(MOECORE_CUDA_ENABLED)
  # The architectures go as explicit -gencode pairs below; OFF keeps CMake from adding a default
  # one of its own. sm_90a and sm_100a are the arch-specific targets (Hopper's wgmma and setmaxnreg,
  # Blackwell's tcgen05): machine code for those chips only, no PTX for the driver to compile.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)
  # CMake 3.25 (Debian 12) knows no C++20 dialect flag for nvcc, and the libraries' C++20 compile
  # features reach the CUDA sources too: name the flag nvcc 12+ takes.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # The toolkit's libraries, next to the nvcc that compiles the kernels. Not FindCUDAToolkit:
  # Debian 12's CMake 3.25 module fails on CUDA 13 ("set_property could not find TARGET
  # CUDA::nvToolsExt": it marks that target deprecated without checking that CUDA 13, which has
  # no nvToolsExt library, created it); seen in the fresh-machine check with --cuda.
  get_filename_component(MOECORE_CUDA_ROOT "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(MOECORE_CUDA_ROOT "${MOECORE_CUDA_ROOT}" DIRECTORY)
  foreach(library cudart_static cublasLt cublas)
    find_library(MOECORE_CUDA_${library} NAMES ${library} REQUIRED NO_DEFAULT_PATH
                 HINTS ${MOECORE_CUDA_ROOT}/lib64 ${MOECORE_CUDA_ROOT}/lib
                       ${MOECORE_CUDA_ROOT}/targets/x86_64-linux/lib)
  endforeach()
  find_package(Threads REQUIRED)

  file(GLOB MOECORE_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cpp
       ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cu)
  add_library(moecore_kernels_cuda STATIC ${MOECORE_CUDA_SOURCES})
  # nvcc compiles each kernel file alone (CMake 3.31 and later would batch .cu files in a unity
  # build): they share names in their anonymous namespaces, as their emulated copies do.
  set(MOECORE_CUDA_KERNEL_FILES ${MOECORE_CUDA_SOURCES})
  list(FILTER MOECORE_CUDA_KERNEL_FILES INCLUDE REGEX "\\.cu$")
  set_source_files_properties(${MOECORE_CUDA_KERNEL_FILES} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  # The static runtime: a binary needs no libcudart of a matching version where it runs, only the
  # driver (and cuBLAS / cuBLASLt, which the toolkit and PyTorch's wheels both bring).
  target_link_libraries(moecore_kernels_cuda PUBLIC moecore_kernels ${MOECORE_CUDA_cudart_static}
                        ${MOECORE_CUDA_cublasLt} ${MOECORE_CUDA_cublas} Threads::Threads
                        ${CMAKE_DL_LIBS} rt)
  target_include_directories(moecore_kernels_cuda SYSTEM PUBLIC
                             ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
  target_compile_options(moecore_kernels_cuda PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:${MOECORE_WARNINGS} ${MOECORE_ENGINE_FP_FLAGS}>
      $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a
                                 -gencode=arch=compute_100a,code=sm_100a
                                 --Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  add_dependencies(moecore_kernels_cuda moecore_layer_check)

  # NCCL, next to the toolkit like its other libraries (the toolkit's own or a copy installed into
  # it): moecore_dist_nccl, dist::Communicator over NCCL (src/dist/nccl/, which the dist layer's
  # own library leaves out). Optional: a CUDA build without NCCL builds everything else.
  find_library(MOECORE_NCCL_LIBRARY NAMES nccl NO_DEFAULT_PATH
               HINTS ${MOECORE_CUDA_ROOT}/lib64 ${MOECORE_CUDA_ROOT}/lib
                     ${MOECORE_CUDA_ROOT}/targets/x86_64-linux/lib)
  find_path(MOECORE_NCCL_INCLUDE_DIR nccl.h NO_DEFAULT_PATH
            HINTS ${MOECORE_CUDA_ROOT}/include ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
  if(MOECORE_NCCL_LIBRARY AND MOECORE_NCCL_INCLUDE_DIR)
    set(MOECORE_NCCL_ENABLED ON)
    file(STRINGS ${MOECORE_NCCL_INCLUDE_DIR}/nccl.h nccl_version_lines
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" nccl_version "${nccl_version_lines}")
    string(REPLACE ";" "." nccl_version "${nccl_version}")
    message(STATUS "moecore: NCCL ${nccl_version} (${MOECORE_NCCL_LIBRARY})")
    file(GLOB MOECORE_NCCL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/dist/nccl/*.cpp
         ${CMAKE_SOURCE_DIR}/src/dist/nccl/*.cu)
    # NCCL's device API (2.28 and later): the symmetric transport's kernel stores into the peers'
    # memory (nccl_block_exchange.*). Without it that transport is a one-line error.
    if(nccl_version VERSION_GREATER_EQUAL 2.28)
      set(MOECORE_NCCL_DEVICE_API 1)
    else()
      set(MOECORE_NCCL_DEVICE_API 0)
      list(FILTER MOECORE_NCCL_SOURCES EXCLUDE REGEX "/nccl_block_exchange\\.[^/]*$")
      message(STATUS "moecore: NCCL ${nccl_version} has no device API (2.28 or later): "
                     "parallel.rowwise_transport=\"symmetric\" is not built")
    endif()
    add_library(moecore_dist_nccl STATIC ${MOECORE_NCCL_SOURCES})
    target_compile_definitions(moecore_dist_nccl PUBLIC
                               MOECORE_NCCL_DEVICE_API=${MOECORE_NCCL_DEVICE_API})
    # moecore_dist is defined after this file (CMakeLists.txt); the name resolves at generation.
    target_link_libraries(moecore_dist_nccl PUBLIC moecore_dist moecore_kernels_cuda
                          ${MOECORE_NCCL_LIBRARY})
    target_include_directories(moecore_dist_nccl SYSTEM PUBLIC ${MOECORE_NCCL_INCLUDE_DIR})
    target_compile_options(moecore_dist_nccl PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:${MOECORE_WARNINGS} ${MOECORE_ENGINE_FP_FLAGS}>
        $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a
                                   -gencode=arch=compute_100a,code=sm_100a
                                   --Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
    add_dependencies(moecore_dist_nccl moecore_layer_check)
  else()
    message(STATUS "moecore: NCCL not found next to ${CMAKE_CUDA_COMPILER} (libnccl and nccl.h): "
                   "building the CUDA backend without dist::Communicator over NCCL")
  endif()
endif()
