#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds the outside project against it and
# checks what it prints. Usage: check.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$here" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/build" >/dev/null
output=$("$scratch/build/consumer")
expected="tensor([ 20.0855, 109.1963, 445.2395])"
if [ "$output" != "$expected" ]; then
  echo "consumer printed: $output"
  echo "expected:         $expected"
  exit 1
fi
echo "consumer printed $output"
