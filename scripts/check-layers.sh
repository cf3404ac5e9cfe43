#!/usr/bin/env bash
# Fails when a module imports from a module the layout does not allow it
# to: the layers inside the library crate (shared/), and the module rules
# inside the ingest and worker crates. The table and the check are one
# Rust test, tests/tests/layers.rs (its one home); this runs it, and CI
# runs this.
#
#   scripts/check-layers.sh          # exit 0, or 101 naming every bad edge
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --quiet -p hookinbox-tests --test layers
