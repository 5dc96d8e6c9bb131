#!/usr/bin/env bash
# On the GPU machine: the walkthrough, the whole test suite (also with CUDA graphs forced on),
# and compute-sanitizer over the GPU tests, each logged to $OUT (default: gpu-logs/). Run
# scripts/gpu-bundle.sh here first and carry gpu-bundle/. Usage: scripts/gpu-check.sh [GTEST_FILTER]
#
# The suite, the graphs-forced suite and the sanitizers run side by side (about 280 s on the
# H200 from a cold kernel cache, against twice that one after another), sharing one disk kernel
# cache; the two tests that exhaust the GPU's memory or move 17 GB run alone afterwards, in both
# modes, so that nothing else is running when they do.
set -uo pipefail
cd "$(dirname "$0")/.."
# Gloo (in every binary) finds its own dependencies, which the bundle carries, only through the
# loader's path.
export LD_LIBRARY_PATH=$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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
alone='Cuda.OutOfMemoryIsTypedAndRecoverable:Cuda.MoreThanTwoToTheThirtyOneElements'
# The CPU JIT's tests need the JIT's library and LLVM 14 beside the binary, which the bundle does
# not carry (LLVM alone would pass the 64 MiB): CPU-only, they run in CI.
cpu_only='CpuJit.*'
(
  $bin/lazyfuse_tests --gtest_filter="$filter:-$alone:$cpu_only" > "$out/tests.log" 2>&1
  echo "tests exit $?" >> "$out/tests.log"
) &
# Again with every evaluation that can be recorded as a CUDA graph recorded and replayed,
# started once the first run has compiled the most common kernels.
(
  sleep 50
  LAZYFUSE_CUDA_GRAPHS=always $bin/lazyfuse_tests --gtest_filter="$filter:-$alone:$cpu_only" \
    > "$out/tests-graphs.log" 2>&1
  echo "tests with LAZYFUSE_CUDA_GRAPHS=always exit $?" >> "$out/tests-graphs.log"
) &
# Under the sanitizers: the GPU tests, less those that exhaust memory, move 17 GB, or start
# child processes.
sanitized="Cuda*:FastMath*:*/CudaGradcheck.*:ColumnStep.*:*Attention*OnTheGpu*:-$alone:CudaCache.TwoProcessesFillOneDirectoryAtOnce"
if command -v compute-sanitizer > /dev/null; then
  # The three tools side by side: one after another they outlast the suites by minutes.
  for tool in memcheck racecheck initcheck; do
    (
      sleep 20
      # initcheck reports the reads after cuBLAS's half-precision gemms (values verified by the
      # test itself over NaN-filled memory) as uninitialized: that one test is left to the others.
      tool_filter="$sanitized"
      [ $tool = initcheck ] && tool_filter="$sanitized:Cuda.HalfMatmulReadsEveryOperandLayout"
      compute-sanitizer --tool $tool --error-exitcode 9 $bin/lazyfuse_tests \
        --gtest_filter="$tool_filter" > "$out/sanitizer-$tool.log" 2>&1
      echo "compute-sanitizer $tool exit $?" >> "$out/sanitizer-$tool.log"
    ) &
  done
fi
wait
for mode in default always; do
  LAZYFUSE_CUDA_GRAPHS=$([ $mode = always ] && echo always || echo on) \
    $bin/lazyfuse_tests --gtest_filter="$alone" > "$out/tests-alone-$mode.log" 2>&1
  echo "tests run alone (graphs $mode) exit $?" >> "$out/tests-alone-$mode.log"
done
tail -n 3 "$out"/*.log
