#!/usr/bin/env bash
# Here, after `make build`: the stripped binaries and the one shared library they need, laid
# out as bin/ and lib/ (the binaries look in $ORIGIN/../lib) under gpu-bundle/, small enough to
# carry to the GPU machine (64 MiB at most: each binary carries OpenBLAS, ~25 MB, so carry
# only what the run needs). Usage: scripts/gpu-bundle.sh [BUILD_DIR [BINARY...]]
# (default: the tests and the walkthrough, what scripts/gpu-check.sh runs).
set -euo pipefail
build=${1:-build}
shift || true
binaries=("$@")
[ ${#binaries[@]} -eq 0 ] && binaries=(lazyfuse_tests walkthrough)
cd "$(dirname "$0")/.."
rm -rf gpu-bundle
mkdir -p gpu-bundle/bin gpu-bundle/lib
for binary in "${binaries[@]}"; do
  strip -o "gpu-bundle/bin/$binary" "$build/bin/$binary"
done
cp "$build/lib/libsleef.so.3" "$build/lib/libgloo.so.0" gpu-bundle/lib/
# Gloo's own dependencies (hiredis, ibverbs, netlink), which the GPU machine need not have; a
# script running the bundle puts its lib/ on LD_LIBRARY_PATH, since libgloo looks for them there.
ldd "$build/lib/libgloo.so.0" | awk '/hiredis|ibverbs|libnl/ {print $3}' |
  xargs -r cp -t gpu-bundle/lib/
# The host-cost benchmark links Debian's Google Benchmark, whose soname the GPU machine's lacks.
if [[ " ${binaries[*]} " == *" lazyfuse_host_bench "* ]]; then
  cp "$(ldd "$build/bin/lazyfuse_host_bench" | awk '/libbenchmark/ {print $3}')" gpu-bundle/lib/
fi
du -sh gpu-bundle
