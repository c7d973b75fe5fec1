#!/usr/bin/env bash
# Runs every sluice test: installs what the tests need, then the workspace tests.
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace --all-targets
