#!/usr/bin/env bash
# Runs the whole test suite against the local Postgres and RabbitMQ.
#
# The integration tests start the real binaries too, so they are built
# first (`cargo nextest run` alone builds only test targets). Extra
# arguments go to nextest, e.g. `scripts/test.sh -E 'test(fenced)'`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${HOOKINBOX_GITHUB_FIXTURES:-}" ] && [ -d ../shared/fixtures/github-payloads ]; then
  HOOKINBOX_GITHUB_FIXTURES="$(cd ../shared/fixtures/github-payloads && pwd)"
  export HOOKINBOX_GITHUB_FIXTURES
fi
cargo build --workspace --bins --examples
cargo nextest run --workspace --no-fail-fast "$@"
# Tests that restart the shared RabbitMQ run alone, after the suite.
if [ "$#" -eq 0 ]; then
  cargo nextest run --workspace --no-fail-fast --run-ignored only --test-threads 1
fi
