#!/usr/bin/env bash
# The fault-injection suite (tests/src/bin/faults.rs) with the binaries
# built with their kill points (`--features failpoints`, a separate target
# directory, so no other build carries them).
# Usage: scripts/faults.sh [CYCLES] [WORKER_KILLS_PER_CYCLE]
#   HOOKINBOX_FAULT_REPORT=path writes the Markdown report there too.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --features failpoints -p hookinbox-ingest -p hookinbox-worker --target-dir target/faults
cargo build -q -p hookinbox-tests --bin faults
HOOKINBOX_FAULT_BINS="$(pwd)/target/faults/debug" exec target/debug/faults "${1:-1}" "${2:-3}"
