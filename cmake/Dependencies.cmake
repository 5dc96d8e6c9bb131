# Dependencies, all from Debian packages (scripts/install-deps.sh installs them).
#
# abseil is linked statically so that binaries built here run on machines without it (the GPU
# machine has none). Debian's CMake targets name the shared libraries; every absl target we
# reach is re-pointed at the static archive that sits beside its .so.
find_package(absl CONFIG REQUIRED)
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
# JSON for the safetensors header (frontend/serialize.cc). Header-only and used by that .cc
# alone, behind $<BUILD_INTERFACE>: the installed package needs nothing of it.
find_package(nlohmann_json 3.10 REQUIRED)

set(LAZYFUSE_ABSL absl::strings absl::str_format absl::hash absl::flat_hash_map
    absl::flat_hash_set)

include(${CMAKE_CURRENT_LIST_DIR}/lazyfuseStaticAbsl.cmake)
foreach(target IN LISTS LAZYFUSE_ABSL)
  lazyfuse_absl_to_static(${target})
endforeach()

# OpenBLAS: Debian ships the static archive; link it so nothing needs installing elsewhere. Its
# OpenMP build, whose gemm runs on the same OpenMP threads as lazyfuse's own loops: the pthreads
# build kept a pool of its own spinning beside OpenMP's, and an MLP training step on the 2-core
# machine took 48 ms against 28 with gemm on one thread (2026-12-05).
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES x86_64-linux-gnu/openblas-openmp
          aarch64-linux-gnu/openblas-openmp NO_DEFAULT_PATH PATHS /usr/include REQUIRED)
find_library(OPENBLAS_STATIC NAMES libopenblas.a
             PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
             NO_DEFAULT_PATH REQUIRED)

# SLEEF: Debian ships only the shared library. It is copied into build/lib, and binaries look
# for it there first ($ORIGIN/../lib), so a build tree carried to another machine runs.
find_path(SLEEF_INCLUDE_DIR sleef.h PATH_SUFFIXES x86_64-linux-gnu aarch64-linux-gnu REQUIRED)
find_library(SLEEF_LIBRARY sleef REQUIRED)
get_filename_component(SLEEF_REAL "${SLEEF_LIBRARY}" REALPATH)
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/lib)
file(COPY_FILE "${SLEEF_REAL}" "${PROJECT_BINARY_DIR}/lib/libsleef.so.3" ONLY_IF_DIFFERENT)
# Gloo, the same way (Debian ships it shared): collectives among a job's processes.
find_library(GLOO_LIBRARY gloo REQUIRED)
get_filename_component(GLOO_REAL "${GLOO_LIBRARY}" REALPATH)
file(COPY_FILE "${GLOO_REAL}" "${PROJECT_BINARY_DIR}/lib/libgloo.so.0" ONLY_IF_DIFFERENT)
set(CMAKE_BUILD_RPATH "$ORIGIN/../lib")
set(CMAKE_INSTALL_RPATH "$ORIGIN/../lib")

# CUDA toolkit headers and NVRTC, when present (the CUDA path); a CPU-only build otherwise.
find_package(CUDAToolkit QUIET)
