#!/usr/bin/env bash
# The CPU kernels built for one instruction set (codegen/cpu/cpu_kernels_avx2.cc, _avx512.cc) must
# define no function another file could share at link time, only their kernel table: an inline
# function compiled with -mavx512f and merged by the linker with a baseline file's copy would run
# AVX-512 code on a CPU without it. Lists each such object's defined functions (T, W, V, u, i)
# and fails on any but kernel_table(). DW.ref.__gxx_personality_v0, which an object with
# exception tables may carry, is a pointer to the C++ runtime's personality routine, alike in
# every object, not code.
# Usage: tests/isa_symbols.sh LIBLAZYFUSE_CODEGEN.a
set -euo pipefail
library=$1
bad=$(nm -C --defined-only "$library" | awk '
  /^cpu_kernels_avx(2|512)\.cc\.o:$/ { object = $1; next }
  /\.o:$/ { object = ""; next }
  object != "" && $2 ~ /^[TWVui]$/ && $0 !~ /::kernel_table\(\)$/ &&
    $3 != "DW.ref.__gxx_personality_v0" { print object " " $0 }')
found=$(nm --defined-only "$library" | grep -c -E '^cpu_kernels_avx(2|512)\.cc\.o:$' || true)
if [ "$found" -ne 2 ]; then
  echo "expected the AVX2 and AVX-512 kernel objects in $library, found $found" >&2
  exit 1
fi
if [ -n "$bad" ]; then
  echo "functions an instruction set's kernel file shares with the rest of the program:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "each instruction set's kernel object defines only its table"
