#!/usr/bin/env bash
# On this machine's CPU: lazyfuse's benchmark and the CPU peers (NumPy, numexpr, PyTorch eager,
# torch.compile; bench/cpu_peers.py) on the same workloads, interleaved workload by workload
# and round by round so that the machine's noise hits both, merged into one report (each
# mode's best round). The peers come from PyPI into a virtual environment outside the
# repository ($LAZYFUSE_PEERS_VENV, default ~/.cache/lazyfuse/cpu-peers), made on first use:
# about 5 GB, since PyPI's torch wheel pulls in its CUDA libraries even on the CPU.
# Usage: scripts/cpu-bench.sh [SIZES [ROUNDS]]   (log2 sizes, comma-separated; default 20,24 and
# 2 rounds). Results land in $OUT (default bench-results/cpu): report.md, ceiling.md and the JSON
# files in results.tgz.
# WORKLOADS="exp_mul gelu" runs a subset. BEFORE=DIR (an earlier build, with bin/lazyfuse) also
# runs that build's benchmark, each workload right before ours, and compares the two
# (before-after.md); PEERS=0 leaves the peers out.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-20,24}
rounds=${2:-2}
out=${OUT:-bench-results/cpu}
venv=${LAZYFUSE_PEERS_VENV:-$HOME/.cache/lazyfuse/cpu-peers}
workloads=${WORKLOADS:-exp_mul gelu bias_relu softmax softmax_fn sum_squares chain16 adam layernorm layernorm4k rmsnorm rmsnorm4k log_softmax softmax_cols}
if [ "${PEERS:-1}" != 0 ] && { [ ! -x "$venv/bin/python" ] ||
  ! "$venv/bin/python" -c "import torch, numexpr" 2> /dev/null; }; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet numpy numexpr torch
fi
[ -x build/bin/lazyfuse ] || { echo "build first: make" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/*.json "$out"/results.tgz
for round in $(seq 1 "$rounds"); do
  for workload in $workloads; do
    echo "round $round: $workload" >&2
    if [ -n "${BEFORE:-}" ]; then
      mkdir -p "$out/before"
      "$BEFORE/bin/lazyfuse" bench --device=cpu --workloads "$workload" --sizes ${sizes//,/ } \
        --dtypes f32 --batches 5 --json "$out/before/lazyfuse-$workload-$round.json" > /dev/null
    fi
    build/bin/lazyfuse bench --device=cpu --workloads "$workload" --sizes ${sizes//,/ } \
      --dtypes f32 --batches 5 --json "$out/lazyfuse-$workload-$round.json" > /dev/null
    [ "${PEERS:-1}" = 0 ] ||
      "$venv/bin/python" bench/cpu_peers.py --out "$out" --sizes "$sizes" --workloads "$workload" \
        --tag="-$workload-$round" 2>> "$out/peers.log"
  done
done
[ -n "${BEFORE:-}" ] && python3 bench/compare.py --before "$out"/before/*.json \
  --after "$out"/lazyfuse-*.json --markdown "$out/before-after.md"
python3 bench/report.py --cpu "$out"/*.json --markdown "$out/report.md"
# What one compiled, fused loop gets on the same machine (the ceiling of a JIT; AVX-512 only).
[ -x build/bin/lazyfuse_cpu_loop_ceiling ] &&
  { build/bin/lazyfuse_cpu_loop_ceiling ${sizes//,/ } > "$out/ceiling.md" 2>&1 || true; }
# One archive for the JSON files.
(cd "$out" && tar -czf results.tgz *.json && rm -f *.json && rm -rf before)
