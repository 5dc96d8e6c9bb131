#!/usr/bin/env bash
# Installs the Debian packages lazyfuse builds and tests with, when any is missing.
# Idempotent: with everything present it only checks and returns.
set -euo pipefail

packages=(
  cmake ninja-build g++ make
  libabsl-dev          # containers, hashing, string formatting (linked statically)
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libsleef-dev         # vectorized transcendentals for the CPU kernels
  libopenblas-openmp-dev  # CPU matmul (static archive), on OpenMP's threads
  libcli11-dev         # the lazyfuse command-line tool
  nlohmann-json3-dev   # the safetensors header's JSON (frontend/serialize.cc)
  libdlpack-dev        # DLPack's header: tensors handed to and from other libraries
  libgloo-dev          # collectives among a job's processes over TCP (runtime/distributed/process_group.cc)
  openmpi-bin          # mpirun, one of the launchers the distributed tests start jobs with
  llvm-14-tools        # FileCheck and not, for the pass tests
  llvm-14-dev clang-14 # the CPU JIT (codegen/cpu/cpu_jit.cc) and the bitcode of its op functions
  graphviz             # lazyfuse dot -o graph.svg
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "Installing missing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
