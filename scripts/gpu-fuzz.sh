#!/usr/bin/env bash
# On the GPU machine: `lazyfuse fuzz --device=cuda:0` over many graphs at once, in parallel
# processes (each graph compiles its own kernels, and NVRTC runs on one core), within a time
# limit. Prints the total of graphs and failures; every failure's shrunk reproducer is in
# $OUT/fuzz.log (FUZZ_DEVICE=cpu runs the same here). Half values round as the process's
# policy says: LAZYFUSE_HALF_ROUNDING=each_op for the other one (give each run its own OUT).
# Usage: scripts/gpu-fuzz.sh LAZYFUSE_BINARY [GRAPHS [PROCESSES [SECONDS [FIRST_SEED]]]]
set -uo pipefail
lazyfuse=$1
graphs=${2:-10010}
processes=${3:-14}
seconds=${4:-140}
first_seed=${5:-2000}
out=${OUT:-gpu-logs}
mkdir -p "$out/fuzz-parts"
chunks=5  # per process, so that a time limit loses at most one chunk's count per process
per_chunk=$(((graphs + processes * chunks - 1) / (processes * chunks)))
deadline=$((SECONDS + seconds))
for p in $(seq 0 $((processes - 1))); do
  (
    for c in $(seq 0 $((chunks - 1))); do
      left=$((deadline - SECONDS))
      [ "$left" -le 1 ] && break
      OMP_NUM_THREADS=1 timeout "$left" "$lazyfuse" fuzz --seed=$((first_seed + p * chunks + c)) \
        --graphs=$per_chunk --device="${FUZZ_DEVICE:-cuda:0}" > "$out/fuzz-parts/$p.$c.log" 2>&1
      echo "exit $?" >> "$out/fuzz-parts/$p.$c.log"
    done
  ) &
done
wait
cat "$out"/fuzz-parts/*.log > "$out/fuzz.log"
rm -rf "$out/fuzz-parts"
grep -h "graphs evaluated" "$out/fuzz.log" |
  awk '{graphs += $1; failures += $(NF - 1)} END {print graphs " graphs evaluated, " failures " failures"}'
echo "chunks stopped by the time limit: $(grep -c 'exit 124' "$out/fuzz.log")"
