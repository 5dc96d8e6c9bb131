#!/usr/bin/env bash
# On the GPU machine: nanoGPT's training step (bench/gpt_step.cc) in lazyfuse and in PyTorch
# eager and torch.compile (bench/gpt_peers.py), from the same weights and batches, on one card
# in one run, for a tiny GPT and GPT-2 124M (float32). Prints one JSON line per implementation
# and size. Run scripts/gpu-bundle.sh with lazyfuse_gpt_step here first and carry gpu-bundle/.
# Usage: scripts/gpu-gpt-step.sh [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
steps=${1:-10}
nvidia-smi --query-gpu=name --format=csv,noheader
for config in "2 128 4 64 4 65" "12 768 12 1024 8 50257"; do
  read -r layers width heads seq batch vocab <<< "$config"
  args=(--layers="$layers" --width="$width" --heads="$heads" --seq="$seq" --batch="$batch"
        --vocab="$vocab" --steps="$steps" --warmup=3)
  gpu-bundle/bin/lazyfuse_gpt_step --device=cuda "${args[@]}"
  python3 bench/gpt_peers.py --device cuda "${args[@]}" --peers eager,compile 2> /dev/null
done
