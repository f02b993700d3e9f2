#!/usr/bin/env bash
# Runs every libFuzzer target of the readers (build-fuzz/fuzz/fuzz_<reader>, `cmake --preset fuzz`)
# for SECONDS each, one after another at the lowest CPU priority (the machine is shared), starting
# from the seed corpus in tests/fuzz/corpus/<reader>. What a run finds (crash, sanitizer report,
# hang, allocation over the limit, broken invariant) is copied into tests/fuzz/regressions/<reader>/,
# which `make test` feeds to the reader (tests/cpp/test_fuzz_regressions.cpp): commit it with the fix.
# Prints executions, coverage (cov: edges, ft: features) and corpus size per target; exits 1 when
# anything new was found (an input already kept is reported as found again, and not copied).
#   scripts/fuzz.sh SECONDS [reader...]
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH="${1:?usage: $0 SECONDS [reader...]}"
shift
READERS=("$@")
[ ${#READERS[@]} -eq 0 ] && READERS=(safetensors npy tokenizer run_config trainer_state hf_config icl_task)
BUILD=build-fuzz
WORK="$BUILD/fuzz-work"
found=0

dict_for() {
  case "$1" in
    run_config) echo tests/fuzz/toml.dict ;;
    *) echo tests/fuzz/json.dict ;;  # safetensors headers, tokenizer.json, trainer_state.json, requests
  esac
}

printf '%-14s %8s %12s %8s %8s %8s %8s %18s\n' reader seconds execs exec/s cov ft corpus oom/timeout/crash
for reader in "${READERS[@]}"; do
  bin="$BUILD/fuzz/fuzz_$reader"
  [ -x "$bin" ] || { echo "fuzz: $bin missing (cmake --preset fuzz && cmake --build --preset fuzz)" >&2; exit 2; }
  corpus="$WORK/corpus/$reader" findings="$WORK/findings/$reader" log="$WORK/$reader.log"
  rm -rf "$findings"  # this run's findings only; earlier ones are kept in tests/fuzz/regressions
  mkdir -p "$corpus" "$findings"
  # The working corpus grows across runs (build-fuzz/, not committed); the seeds are read only.
  # Fork mode with -ignore_*: a finding is saved and fuzzing goes on, so one known bug does not end
  # the run in its first seconds. -rss_limit_mb / -malloc_limit_mb: a reader that believes a size
  # field must not allocate gigabytes before checking it; -timeout: 10 s for one input.
  nice -n 19 "$bin" "$corpus" "tests/fuzz/corpus/$reader" -dict="$(dict_for "$reader")" \
    -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -max_len=16384 -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -artifact_prefix="$findings/" > "$log" 2>&1 || true
  # The fork-mode status line: "#execs: cov: N ft: N corp: N exec/s N oom/timeout/crash: a/b/c".
  last=$(grep -oE '#[0-9]+: cov: [0-9]+ ft: [0-9]+ corp: [0-9]+ exec/s [0-9]+ oom/timeout/crash: [0-9/]+' "$log" | tail -1)
  read -r execs cov ft units rate bad < <(sed -E 's/#([0-9]+): cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+) exec\/s ([0-9]+) oom\/timeout\/crash: ([0-9/]+)/\1 \2 \3 \4 \5 \6/' <<<"$last") || true
  printf '%-14s %8s %12s %8s %8s %8s %8s %18s\n' "$reader" "$SECONDS_EACH" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${units:-?}" "${bad:-?}"
  kept="tests/fuzz/regressions/$reader"
  mkdir -p "$kept"
  for artifact in "$findings"/*; do
    [ -f "$artifact" ] || continue
    known=""
    for old in "$kept"/*; do
      if [ -f "$old" ] && cmp -s "$artifact" "$old"; then known="$old"; break; fi
    done
    if [ -n "$known" ]; then
      echo "  found again: $known (already kept; still unfixed); log: $log"
    else
      found=1
      cp "$artifact" "$kept/"
      echo "  finding: $artifact (kept as $kept/$(basename "$artifact")); log: $log"
    fi
  done
done
exit $found
