#!/usr/bin/env bash
# On the GPU machine: `lazyfuse fuzz --device=cuda:0` over many graphs at once, in parallel
# processes (each graph compiles its own kernels, and NVRTC runs on one core), within a time
# limit. Prints the total of graphs and failures; every failure's shrunk reproducer is in
# $OUT/fuzz.log (FUZZ_DEVICE=cpu runs the same here). Half values round as the process's
# policy says: LAZYFUSE_HALF_ROUNDING=each_op for the other one (give each run its own OUT).
# Usage: scripts/gpu-fuzz.sh LAZYFUSE_BINARY [GRAPHS [PROCESSES [SECONDS [FIRST_SEED]]]]
set -uo pipefail
# Gloo (in every binary) finds its own dependencies, which the bundle carries, only through the
# loader's path.
export LD_LIBRARY_PATH=$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
lazyfuse=$1
graphs=${2:-10010}
processes=${3:-14}
seconds=${4:-140}
first_seed=${5:-2000}
out=${OUT:-gpu-logs}
mkdir -p "$out/fuzz-parts"
# Chunks of at most 100 graphs, run one after another until a process's share is done or the
# time is up, so that the limit loses at most one short chunk's count per process.
share=$(((graphs + processes - 1) / processes))
per_chunk=$((share < 100 ? share : 100))
deadline=$((SECONDS + seconds))
for p in $(seq 0 $((processes - 1))); do
  (
    c=0
    while [ $((c * per_chunk)) -lt "$share" ]; do
      left=$((deadline - SECONDS))
      [ "$left" -le 1 ] && break
      n=$((share - c * per_chunk < per_chunk ? share - c * per_chunk : per_chunk))
      # Odd processes draw the family whose innermost size is 16, 64 or 256 (row steps, and
      # column steps of 32 columns or more).
      rows=$([ $((p % 2)) = 1 ] && echo --rows || true)
      OMP_NUM_THREADS=1 timeout "$left" "$lazyfuse" fuzz --seed=$((first_seed + p * 10000 + c)) \
        --graphs=$n --device="${FUZZ_DEVICE:-cuda:0}" $rows > "$out/fuzz-parts/$p.$c.log" 2>&1
      echo "exit $?" >> "$out/fuzz-parts/$p.$c.log"
      c=$((c + 1))
    done
  ) &
done
wait
cat "$out"/fuzz-parts/*.log > "$out/fuzz.log"
rm -rf "$out/fuzz-parts"
grep -h "graphs evaluated" "$out/fuzz.log" |
  awk '{graphs += $1; failures += $(NF - 1)} END {print graphs " graphs evaluated, " failures " failures"}'
echo "chunks stopped by the time limit: $(grep -c 'exit 124' "$out/fuzz.log")"
