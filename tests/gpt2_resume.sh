#!/usr/bin/env bash
# examples/gpt2 interrupted after 40 of 60 steps and resumed from its checkpoint takes the steps
# the uninterrupted run takes: the same losses, rates and norms, printed to six digits.
# Usage: tests/gpt2_resume.sh GPT2_BINARY
set -euo pipefail
gpt2=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
steps() { grep -E '^step' | sed 's/ | [0-9.]* ms.*//'; }
"$gpt2" --synthetic --eval-every=20 | steps > "$dir/whole.txt"
"$gpt2" --synthetic --eval-every=20 --checkpoint="$dir/ck" --stop-after=40 | steps > "$dir/part.txt"
"$gpt2" --synthetic --eval-every=20 --checkpoint="$dir/ck" --resume | steps >> "$dir/part.txt"
[ "$(wc -l < "$dir/whole.txt")" = 60 ] || { echo "the whole run printed $(wc -l < "$dir/whole.txt") steps"; exit 1; }
diff "$dir/whole.txt" "$dir/part.txt" && echo "the resumed run took the uninterrupted run's steps"
