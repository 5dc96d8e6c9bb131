#!/usr/bin/env bash
# On the GPU machine: lazyfuse's benchmark, then the peers (PyTorch, torch.compile, CuPy, JAX)
# on the same workloads, merged into one report with a plot. Carry gpu-bundle/ (made by
# `scripts/gpu-bundle.sh build lazyfuse`). Results land in $OUT (default bench-results/).
# Usage: scripts/gpu-bench.sh [PEER_SIZES]   (log2 sizes for the peers, default 12,20,26,28)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-results}
mkdir -p "$out/peers"
peer_sizes=${1:-12,20,26,28}
gpu-bundle/bin/lazyfuse bench --json "$out/lazyfuse.json" > "$out/lazyfuse.txt" 2> "$out/lazyfuse.err"
echo "lazyfuse bench exit $?" >> "$out/lazyfuse.txt"
python3 bench/peers.py --out "$out/peers" --sizes "$peer_sizes" --dtypes f32 2> "$out/peers.log"
python3 bench/report.py "$out/lazyfuse.json" "$out"/peers/*.json --png "$out/bench.png" --markdown "$out/report.md"
# One archive for the peers' JSON files: the device tool brings back at most eight files.
tar -C "$out" -czf "$out/peers.tgz" peers && rm -rf "$out/peers"
