#!/usr/bin/env bash
# On this machine's CPU: nanoGPT's training step (bench/gpt_step.cc) in lazyfuse and in PyTorch
# eager and torch.compile (bench/gpt_peers.py), from the same weights and batches, alternating
# round by round so that the machine's noise hits all of them. PyTorch comes from the CPU peers'
# virtual environment ($LAZYFUSE_PEERS_VENV, made by scripts/cpu-bench.sh). Prints one JSON line
# per implementation, size and round.
# Usage: scripts/cpu-gpt-step.sh [ROUNDS]   (default 2: the tiny GPT of issue 43, and six layers
# of width 384 at T 256, B 16)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
venv=${LAZYFUSE_PEERS_VENV:-$HOME/.cache/lazyfuse/cpu-peers}
[ -x build/bin/lazyfuse_gpt_step ] || { echo "build first: make" >&2; exit 1; }
[ -x "$venv/bin/python" ] || { echo "no peers environment: run scripts/cpu-bench.sh once" >&2; exit 1; }
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
# A training run's steady state: the step's programs are compiled by the CPU JIT once each has
# interpreted a compile's work (Note [The CPU JIT]), which a large step's do in its first steps
# and the tiny step's (32k to 131k elements each) in its first ~50; lazyfuse's line counts the
# compiles that fell in the timed steps (jit_compiles).
configs=("--layers=2 --width=128 --heads=4 --seq=64 --batch=4 --steps=20 --warmup=60"
         "--layers=6 --width=384 --heads=6 --seq=256 --batch=16 --steps=3 --warmup=6")
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    # shellcheck disable=SC2086
    build/bin/lazyfuse_gpt_step $config
    # shellcheck disable=SC2086
    "$venv/bin/python" bench/gpt_peers.py $config --peers eager,compile 2> /dev/null
  done
done
