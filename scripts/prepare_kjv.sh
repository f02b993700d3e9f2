#!/usr/bin/env bash
# The default corpus: the King James Bible from Debian's bible-kjv-text, one verse a line with the
# "Ge1:1 " reference prefix stripped. Written atomically so an interrupted run leaves no half file.
set -euo pipefail
out="${1:-data/kjv.txt}"
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
bible -f Gen1:1-Rev22:21 | sed 's/^[^ ]* //' > "$tmp"
[ "$(wc -c < "$tmp")" -gt 1000000 ] || { echo "prepare_kjv: bible printed too little text" >&2; rm -f "$tmp"; exit 1; }
mv "$tmp" "$out"
