#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, moves the prefix elsewhere (a package is copied
# to other directories and machines), and builds the outside project against it: its config
# names no path of this machine, and the consumer needs none of the development packages of
# what lazyfuse linked statically (abseil's headers and archives come from the prefix). Then
# checks what the consumer prints. Usage: check.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/installed" >/dev/null
mv "$scratch/installed" "$scratch/moved"
prefix="$scratch/moved"
if grep -rnE "$build|$source_dir|$scratch/installed|/usr/lib|/usr/include" "$prefix/lib/cmake"; then
  echo "the installed package config names paths of the machine that built it (above)"
  exit 1
fi
cmake -S "$here" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_absl=ON >/dev/null
cmake --build "$scratch/build" >/dev/null
if grep -n "/usr/include/absl" "$scratch/build/CMakeFiles/consumer.dir/consumer.cc.o.d"; then
  echo "the consumer compiled against the system's abseil headers rather than the package's"
  exit 1
fi
if (cd "$scratch/build" && ninja -t commands consumer | grep -E "libabsl|openblas"); then
  echo "the consumer links abseil or OpenBLAS from the system rather than from the package"
  exit 1
fi
output=$("$scratch/build/consumer")
expected="tensor([ 20.0855, 109.1963, 445.2395])"
if [ "$output" != "$expected" ]; then
  echo "consumer printed: $output"
  echo "expected:         $expected"
  exit 1
fi
echo "consumer printed $output, built against the package moved to another directory"
