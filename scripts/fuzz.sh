#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for RUNS executions (default 10,000,000)
# on stable Rust (no sanitizer), growing fuzz/corpus/<target>/, and prints
# the final libFuzzer line of each. A crash leaves its input under
# fuzz/artifacts/<target>/ and makes the script exit non-zero after the
# remaining targets ran.
# Usage: scripts/fuzz.sh [RUNS]
# Environment: FUZZ_MAX_TIME caps each target's run in seconds (default 600).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs="${1:-10000000}"
max_time="${FUZZ_MAX_TIME:-600}"
cargo_fuzz_version="0.13.2"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version"
fi

targets=(signature delivery_ids form_body config)
cargo fuzz build --sanitizer none
failed=()
summary=()
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  log="$(mktemp)"
  echo "== $target"
  if cargo fuzz run "$target" --sanitizer none -- \
    -runs="$runs" -max_total_time="$max_time" -timeout=10 -rss_limit_mb=2048 \
    >"$log" 2>&1; then
    last="$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1)"
    summary+=("$target: ${last:-no Done line, see $log}")
    rm -f "$log"
  else
    summary+=("$target: FAILED, log kept in $log")
    grep -E 'panicked at|^SUMMARY|Test unit written' "$log" || tail -n 20 "$log"
    failed+=("$target")
  fi
done

printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "crashed or failed: ${failed[*]}" >&2
  exit 1
fi
