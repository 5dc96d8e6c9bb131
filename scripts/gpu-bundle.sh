#!/usr/bin/env bash
# Here, after `make build`: the stripped binaries and the one shared library they need, laid
# out as bin/ and lib/ (the binaries look in $ORIGIN/../lib) under gpu-bundle/, small enough to
# carry to the GPU machine. Usage: scripts/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
rm -rf gpu-bundle
mkdir -p gpu-bundle/bin gpu-bundle/lib
for binary in lazyfuse lazyfuse_tests walkthrough; do
  strip -o "gpu-bundle/bin/$binary" "$build/bin/$binary"
done
cp "$build/lib/libsleef.so.3" gpu-bundle/lib/
du -sh gpu-bundle
