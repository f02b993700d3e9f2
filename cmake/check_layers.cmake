# Fails (one line per violation, then a non-zero exit) when a source file under ${SOURCE_DIR}/src
# includes a folder that is not below its own in the layer order, when <mpi.h> (or a header
# that includes it) is included outside src/dist/mpi/, the one place MPI types may appear, or
# when a CUDA toolkit header (or a header that includes one) is included outside the CUDA
# backend's folders, src/kernels/cuda/ and src/dist/nccl/ (a build without the toolkit compiles
# everything else).
#   cmake -DSOURCE_DIR=<repo> -DRULES=<build>/layer_rules.cmake -P check_layers.cmake
# RULES sets MOECORE_LAYERS and, per layer, MOECORE_ALLOWED_<layer>: the folders it may include
# (itself and the layers below). CMakeLists.txt writes it from its moecore_layer() calls.
cmake_minimum_required(VERSION 3.25)
include(${RULES})

file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cpp
     ${SOURCE_DIR}/src/*.cu ${SOURCE_DIR}/src/*.cuh)
list(SORT files)

# Headers that bring MPI types with them (include <mpi.h> directly).
set(mpi_headers "")
foreach(file ${files})
  file(STRINGS ${SOURCE_DIR}/${file} mpi_lines REGEX "^[ \t]*#[ \t]*include[ \t]*<mpi\\.h>")
  if(mpi_lines AND file MATCHES "\\.h$")
    string(REGEX REPLACE "^src/" "" header ${file})
    list(APPEND mpi_headers ${header})
  endif()
endforeach()

# CUDA toolkit headers, and our headers that include one.
set(cuda_header_regex "^(cuda|cuda_runtime|cuda_runtime_api|cuda_bf16|cuda_fp8|cublas|cublas_v2|cublasLt|library_types|nccl|nvshmem)\\.h$")
set(cuda_headers "")
foreach(file ${files})
  file(STRINGS ${SOURCE_DIR}/${file} include_lines REGEX "^[ \t]*#[ \t]*include[ \t]*<[^>]+>")
  foreach(line IN LISTS include_lines)
    string(REGEX MATCH "<([^>]+)>" _ "${line}")
    if(CMAKE_MATCH_1 MATCHES "${cuda_header_regex}" AND file MATCHES "\\.h$")
      string(REGEX REPLACE "^src/" "" header ${file})
      list(APPEND cuda_headers ${header})
    endif()
  endforeach()
endforeach()

set(errors "")
foreach(file ${files})
  string(REGEX MATCH "^src/([^/]+)/" _ ${file})
  set(layer ${CMAKE_MATCH_1})
  if(NOT layer IN_LIST MOECORE_LAYERS)
    list(APPEND errors "${file}: src/${layer}/ is no layer of CMakeLists.txt (moecore_layer)")
    continue()
  endif()
  # One list element per line: characters that CMake lists treat specially are masked first.
  file(READ ${SOURCE_DIR}/${file} text)
  string(REGEX REPLACE "[][;\\]" "_" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(included ${CMAKE_MATCH_1})
    if(NOT file MATCHES "^src/dist/mpi/")
      if(included STREQUAL "mpi.h")
        list(APPEND errors "${file}:${number}: <mpi.h> outside src/dist/mpi/ (use dist/communicator.h)")
        continue()
      endif()
      if(included IN_LIST mpi_headers)
        list(APPEND errors
             "${file}:${number}: ${included} brings MPI types outside src/dist/mpi/ (use dist/communicator.h)")
        continue()
      endif()
    endif()
    if(NOT file MATCHES "^src/(kernels/cuda|dist/nccl)/")
      if(included MATCHES "${cuda_header_regex}" OR included IN_LIST cuda_headers)
        list(APPEND errors
             "${file}:${number}: ${included} (CUDA) outside src/kernels/cuda/ and src/dist/nccl/")
        continue()
      endif()
    endif()
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^/\"]+)/")
      set(folder ${CMAKE_MATCH_1})
      if(folder IN_LIST MOECORE_LAYERS AND NOT folder IN_LIST MOECORE_ALLOWED_${layer})
        string(REPLACE ";" ", " allowed "${MOECORE_ALLOWED_${layer}}")
        list(APPEND errors
             "${file}:${number}: layer ${layer} includes ${included}, but may include only ${allowed}")
      endif()
    endif()
  endforeach()
endforeach()

if(errors)
  foreach(error IN LISTS errors)
    message(NOTICE "${error}")  # unwrapped, one line each
  endforeach()
  list(LENGTH errors count)
  string(REPLACE ";" " < " order "${MOECORE_LAYERS}")
  message(FATAL_ERROR "${count} include(s) break the layer order ${order}")
endif()
