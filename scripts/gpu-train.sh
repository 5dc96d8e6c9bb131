#!/usr/bin/env bash
# On the GPU machine: the training step against PyTorch. First the loss after each of 100 steps,
# lazyfuse against PyTorch from the same initial parameters and batches (float64 and float32,
# bench/train_compare.py); then the step time of lazyfuse_train_bench and of the peers
# (bench/train_peers.py) at batch 32 and 1024, float32 and bfloat16. Everything goes to
# $OUT/train.log (default gpu-logs/). Last, where ncu exists, the kernels a lazyfuse step runs as
# the GPU sees them (cuBLAS's own kernels counted one by one, unlike the benchmark's launches),
# with their names (bench/ncu_kernels_per_step.py). Carry a bundle with lazyfuse_train_bench
# (scripts/gpu-bundle.sh build lazyfuse_train_bench ...).
# Usage: scripts/gpu-train.sh [BATCHES [DTYPES [PEERS]]]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
batches=${1:-32,1024}
dtypes=${2:-float32,bfloat16}
peers=${3:-eager,compile,reduce-overhead,jax}
bin=gpu-bundle/bin
export LAZYFUSE_CACHE_DIR=${LAZYFUSE_CACHE_DIR:-$(mktemp -d)}
log="$out/train.log"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
  python3 -c 'import jax; print("jax", jax.__version__)' 2>&1
  for dtype in float64 float32; do
    dir=$(mktemp -d)
    $bin/lazyfuse_train_bench --device=cuda:0 --dtype=$dtype --steps=100 --dump="$dir" > /dev/null &&
      python3 bench/train_compare.py "$dir" --device cuda:0
    echo "compare $dtype exit $?"
  done
  for batch in ${batches//,/ }; do
    for dtype in ${dtypes//,/ }; do
      $bin/lazyfuse_train_bench --device=cuda:0 --dtype=$dtype --batch=$batch
      python3 bench/train_peers.py --dtype=$dtype --batch=$batch --peers=$peers
    done
  done
  if command -v ncu > /dev/null; then
    for batch in ${batches//,/ }; do
      for dtype in ${dtypes//,/ }; do
        python3 bench/ncu_kernels_per_step.py $bin/lazyfuse_train_bench --device=cuda:0 \
          --dtype=$dtype --batch=$batch
      done
    done
  fi
} > "$log" 2>&1
cat "$log"
