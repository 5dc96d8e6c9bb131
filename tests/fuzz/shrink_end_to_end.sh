#!/usr/bin/env bash
# End to end: a fault injected on purpose (LAZYFUSE_TEST_FAULT=OP adds 1 to every OP result of
# the graph under test) must make `lazyfuse fuzz` fail; its first report must be shrunk to a
# few nodes that still hold OP; and the printed graph and replay command must fail again under
# `lazyfuse run --check-unfused`, and pass there without the fault.
# Usage: shrink_end_to_end.sh LAZYFUSE_BINARY
set -euo pipefail
lazyfuse=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export PATH="$(dirname "$lazyfuse"):$PATH"

fail() {
  echo "FAILED: $*"
  cat "$dir/out"
  exit 1
}

for op in exp max narrow where; do
  echo "--- LAZYFUSE_TEST_FAULT=$op"
  status=0
  LAZYFUSE_TEST_FAULT=$op lazyfuse fuzz --seed=1 --graphs=50 >"$dir/out" 2>/dev/null || status=$?
  [[ $status == 1 ]] || fail "fuzz exited with $status, not 1"

  # The first report: "shrunk from N nodes to M (...)", the graph, "replay: COMMAND  (FILE: ...)".
  read -r from to < <(sed -nE 's/^shrunk from ([0-9]+) nodes to ([0-9]+) .*/\1 \2/p' "$dir/out" |
    head -n 1)
  echo "shrunk from $from nodes to $to"
  ((to < from && to <= 4)) || fail "not shrunk to 4 nodes or fewer"
  awk '/^shrunk from/ { report = 1 } report && /^graph @/ { graph = 1 }
       graph { print } graph && /^}/ { exit }' "$dir/out" >"$dir/repro.ir"
  cat "$dir/repro.ir"
  grep -q " = $op " "$dir/repro.ir" || fail "the shrunk graph has no $op"

  replay=$(sed -nE 's/^replay: (.*)  \(FILE: the graph above\)$/\1/p' "$dir/out" | head -n 1)
  [[ $replay == "LAZYFUSE_TEST_FAULT=$op lazyfuse run FILE --seed="* ]] ||
    fail "unexpected replay command: $replay"
  replay=${replay//FILE/$dir/repro.ir}
  status=0
  bash -c "$replay" >"$dir/replay" 2>&1 || status=$?
  [[ $status == 1 ]] && grep -q "MISMATCH" "$dir/replay" ||
    fail "the replay did not fail: $(cat "$dir/replay")"
  # Without the fault the same graph and inputs agree.
  bash -c "${replay#LAZYFUSE_TEST_FAULT=$op }" >"$dir/replay" 2>&1 ||
    fail "the replay failed without the fault: $(cat "$dir/replay")"
done
echo "ok"
