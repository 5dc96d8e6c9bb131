#!/usr/bin/env bash
# On the GPU machine: the walkthrough, the whole test suite (also with CUDA graphs forced on),
# and compute-sanitizer over the GPU tests, each logged to $OUT (default: gpu-logs/). Run
# scripts/gpu-bundle.sh here first and carry gpu-bundle/. Usage: scripts/gpu-check.sh [GTEST_FILTER]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
bin=gpu-bundle/bin
filter=${1:-*}
export LAZYFUSE_CACHE_DIR=$(mktemp -d)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} > "$out/machine.log" 2>&1
$bin/walkthrough > "$out/walkthrough.log" 2>&1; echo "walkthrough exit $?" >> "$out/walkthrough.log"
$bin/lazyfuse_tests --gtest_filter="$filter" > "$out/tests.log" 2>&1; echo "tests exit $?" >> "$out/tests.log"
# Again with every evaluation that can be recorded as a CUDA graph recorded and replayed.
LAZYFUSE_CUDA_GRAPHS=always $bin/lazyfuse_tests --gtest_filter="$filter" > "$out/tests-graphs.log" 2>&1
echo "tests with LAZYFUSE_CUDA_GRAPHS=always exit $?" >> "$out/tests-graphs.log"
# Under the sanitizers: the GPU tests, less those that exhaust memory, move 17 GB, or start
# child processes.
sanitized='Cuda*:FastMath*:*/CudaGradcheck.*:-Cuda.OutOfMemoryIsTypedAndRecoverable:Cuda.MoreThanTwoToTheThirtyOneElements:CudaCache.TwoProcessesFillOneDirectoryAtOnce'
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck initcheck; do
    # initcheck reports the reads after cuBLAS's half-precision gemms (values verified by the
    # test itself over NaN-filled memory) as uninitialized: that one test is left to the others.
    tool_filter="$sanitized"
    [ $tool = initcheck ] && tool_filter="$sanitized:Cuda.HalfMatmulReadsEveryOperandLayout"
    compute-sanitizer --tool $tool --error-exitcode 9 $bin/lazyfuse_tests \
      --gtest_filter="$tool_filter" > "$out/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool exit $?" >> "$out/sanitizer-$tool.log"
  done
fi
tail -n 3 "$out"/*.log
