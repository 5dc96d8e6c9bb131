#!/usr/bin/env bash
# On this machine's CPU: lazyfuse_train_bench (an MLP's training step: Linear+ReLU layers,
# cross-entropy, Adam, the loss read back every step) and the same step in PyTorch eager and
# torch.compile (bench/train_peers.py --device cpu), alternating round by round so that the
# machine's noise hits both. PyTorch comes from the CPU peers' virtual environment
# ($LAZYFUSE_PEERS_VENV, made by scripts/cpu-bench.sh). Prints one JSON line per run.
# Usage: scripts/cpu-train-bench.sh [ROUNDS [CONFIGS...]], a config being
# "BATCH,WIDTH,LAYERS" (default 2 rounds of 32,1024,4 and 256,512,4).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(32,1024,4 256,512,4)
venv=${LAZYFUSE_PEERS_VENV:-$HOME/.cache/lazyfuse/cpu-peers}
[ -x build/bin/lazyfuse_train_bench ] || { echo "build first: make" >&2; exit 1; }
[ -x "$venv/bin/python" ] || { echo "no peers environment: run scripts/cpu-bench.sh once" >&2; exit 1; }
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    IFS=, read -r batch width layers <<< "$config"
    build/bin/lazyfuse_train_bench --device=cpu --batch="$batch" --width="$width" \
      --layers="$layers" --steps=30 --warmup=5
    "$venv/bin/python" bench/train_peers.py --device cpu --batch "$batch" --width "$width" \
      --layers "$layers" --steps 30 --warmup 5 --peers eager,compile 2> /dev/null
  done
done
