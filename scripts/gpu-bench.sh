#!/usr/bin/env bash
# On the GPU machine: lazyfuse's benchmark, then the peers (PyTorch, torch.compile, CuPy, JAX)
# on the same workloads, merged into one report with a plot. Carry gpu-bundle/ (made by
# `scripts/gpu-bundle.sh build lazyfuse`, with lazyfuse_half_accuracy for the half rounding
# policies' accuracy and lazyfuse_attention_bench for attention). Results land in $OUT
# (default bench-results/).
# Ours runs one process per workload, each writing its own JSON, so that a time limit loses at
# most the workload it cut.
# Usage: scripts/gpu-bench.sh [PEER_SIZES [OUR_SIZES]]   (log2 sizes, comma-separated; defaults
# 12,20,26,28 for the peers and the benchmark's own for ours)
# BEFORE=DIR (a bundle of an earlier build, laid out as gpu-bundle/) also runs that build's
# benchmark, each workload right before ours, and compares the two (before-after.md);
# PEERS=0 leaves the peers out.
set -uo pipefail
cd "$(dirname "$0")/.."
# Gloo (in every binary) finds its own dependencies, which the bundle carries, only through the
# loader's path.
export LD_LIBRARY_PATH=$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-bench-results}
mkdir -p "$out/peers" "$out/ours"
peer_sizes=${1:-12,20,26,28}
our_sizes=()
[ -n "${2:-}" ] && our_sizes=(--sizes ${2//,/ })
for workload in exp_mul gelu bias_relu softmax sum_squares chain16 adam layernorm layernorm4k \
  rmsnorm rmsnorm4k log_softmax softmax_cols; do
  if [ -n "${BEFORE:-}" ]; then
    mkdir -p "$out/before"
    "$BEFORE/bin/lazyfuse" bench --workloads "$workload" "${our_sizes[@]}" \
      --json "$out/before/$workload.json" >> "$out/before.txt" 2>> "$out/lazyfuse.err"
    echo "before: lazyfuse bench $workload exit $?" >> "$out/before.txt"
  fi
  gpu-bundle/bin/lazyfuse bench --workloads "$workload" "${our_sizes[@]}" \
    --json "$out/ours/$workload.json" >> "$out/lazyfuse.txt" 2>> "$out/lazyfuse.err"
  echo "lazyfuse bench $workload exit $?" >> "$out/lazyfuse.txt"
done
[ -n "${BEFORE:-}" ] &&
  python3 bench/compare.py --before "$out/before" --after "$out/ours" --markdown "$out/before-after.md"
# Each half rounding policy's error against float64 on the GPU, where the bundle has the tool.
[ -x gpu-bundle/bin/lazyfuse_half_accuracy ] &&
  gpu-bundle/bin/lazyfuse_half_accuracy --device=cuda:0 > "$out/half-accuracy.md" 2>&1
[ "${PEERS:-1}" != 0 ] &&
  python3 bench/peers.py --out "$out/peers" --sizes "$peer_sizes" --dtypes f32,bf16 2> "$out/peers.log"
python3 bench/report.py "$out"/ours/*.json $(ls "$out"/peers/*.json 2> /dev/null) \
  --png "$out/bench.png" --markdown "$out/report.md"
# Attention (bench/attention_bench.cc): the API, the hand-written form and its composite graph,
# forward and forward+backward, bfloat16 and float16, at the attention issue's shapes; then
# PyTorch's and JAX's (bench/attention_peers.py) unless PEERS=0.
if [ -x gpu-bundle/bin/lazyfuse_attention_bench ]; then
  for shape in gpt2 long padded; do
    for dtype in bfloat16 float16; do
      for form in api hand composite; do
        [ $shape = long ] && [ $form = composite ] && continue  # its scores: 8 GB a layer
        for pass in "" --backward; do
          gpu-bundle/bin/lazyfuse_attention_bench --device=cuda:0 --shape=$shape --dtype=$dtype \
            --form=$form $pass >> "$out/attention.jsonl" 2>> "$out/lazyfuse.err"
        done
      done
    done
  done
  [ "${PEERS:-1}" != 0 ] &&
    python3 bench/attention_peers.py >> "$out/attention-peers.jsonl" 2>> "$out/peers.log"
fi
# One archive for all the JSON files: the device tool brings back at most eight files.
tar -C "$out" -czf "$out/results.tgz" ours peers $([ -d "$out/before" ] && echo before) &&
  rm -rf "$out/ours" "$out/peers" "$out/before"
