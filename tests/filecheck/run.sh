#!/usr/bin/env bash
# A small lit: runs each "// RUN:" line of FILE through bash with %s (the file), %S (its
# directory) and the tools substituted. Usage: run.sh FILE LAZYFUSE_BIN_DIR LLVM_BIN_DIR
set -euo pipefail
file=$1 bin=$2 llvm=$3
dir=$(cd "$(dirname "$file")" && pwd)
export PATH="$bin:$llvm:$PATH"
status=0
while IFS= read -r line; do
  command=${line#*RUN: }
  command=${command//%s/$file}
  command=${command//%S/$dir}
  echo "RUN: $command"
  if ! bash -o pipefail -c "$command"; then
    echo "FAILED: $command"
    status=1
  fi
done < <(grep -E '^// RUN: ' "$file")
exit $status
