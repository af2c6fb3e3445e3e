# Third-party dependencies, all from Debian 12 packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(OpenBLAS CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
# Debian builds cpp-httplib as a library; pkg-config adds the CPPHTTPLIB_* defines it was built with.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# KV cache events in vLLM's format (ZeroMQ PUB/ROUTER sockets).
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
# The tcp KV transport's mutual TLS.
find_package(OpenSSL REQUIRED)
# The ucx KV transport (libucx-dev): PDSERVE_UCX=AUTO builds it when found.
set(PDSERVE_HAVE_UCX OFF)
if(NOT PDSERVE_UCX STREQUAL "OFF")
  if(PDSERVE_UCX STREQUAL "ON")
    pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
  else()
    pkg_check_modules(UCX IMPORTED_TARGET ucx)
  endif()
  if(UCX_FOUND)
    set(PDSERVE_HAVE_UCX ON)
  endif()
endif()
message(STATUS "pdserve: ucx KV transport ${PDSERVE_HAVE_UCX}")

# OpenBLAS' config gives variables, not a target: wrap them once.
add_library(pdserve_openblas INTERFACE)
target_include_directories(pdserve_openblas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(pdserve_openblas INTERFACE ${OpenBLAS_LIBRARIES})

find_program(PDSERVE_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT PDSERVE_PYTHON3)
  message(FATAL_ERROR "Debian's /usr/bin/python3 (with python3-numpy) is required for the reference tests")
endif()
