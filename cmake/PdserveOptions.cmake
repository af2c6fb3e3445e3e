# Build options. Every option has one meaning and one place where it is read.
set(PDSERVE_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE PDSERVE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(PDSERVE_UCX "AUTO" CACHE STRING "Build the ucx KV transport: AUTO (when libucx-dev is found), ON, OFF")
set_property(CACHE PDSERVE_UCX PROPERTY STRINGS AUTO ON OFF)
# The CPU kernels are written for AVX2 + FMA + F16C (x86-64-v3): every machine we run on has them.
# "native" tunes for the build machine; "portable" builds the scalar twins only.
set(PDSERVE_CPU_ARCH "x86-64-v3" CACHE STRING "CPU target for kernels: x86-64-v3, native or portable")
set(PDSERVE_SANITIZE "" CACHE STRING "Comma-separated sanitizers, e.g. address,undefined")
option(PDSERVE_WERROR "Treat warnings as errors" OFF)
option(PDSERVE_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

add_compile_options(-Wall -Wextra -Wno-unused-parameter -Wno-sign-compare)
if(PDSERVE_WERROR)
  add_compile_options(-Werror)
endif()

if(PDSERVE_CPU_ARCH STREQUAL "native")
  set(PDSERVE_CPU_FLAGS -march=native)
elseif(PDSERVE_CPU_ARCH STREQUAL "portable")
  set(PDSERVE_CPU_FLAGS "")
else()
  set(PDSERVE_CPU_FLAGS -march=${PDSERVE_CPU_ARCH})
endif()
# Only on C++ sources: nvcc has its own architecture flags.
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${PDSERVE_CPU_FLAGS}>")

if(PDSERVE_SANITIZE)
  string(REPLACE "," ";" _san_list "${PDSERVE_SANITIZE}")
  foreach(_san ${_san_list})
    add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer)
    add_link_options(-fsanitize=${_san})
  endforeach()
endif()

if(PDSERVE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PDSERVE_FUZZ needs clang (CXX=clang++): libFuzzer is part of it")
  endif()
  # Coverage for the fuzzers in every library; the fuzz targets link libFuzzer's main.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()
