#!/usr/bin/env bash
# Builds the Python binding into .venv (debug build, in the workspace's target dir, so cargo
# reuses what the Rust tests compiled) with the tools its tests, stubs check and bench need.
# Arguments go to `maturin develop`: `make demo` passes --release, which reuses the release
# build of the CLI's dependencies (the two resolve the same features: scripts/same-features.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
.venv/bin/pip install -q 'maturin>=1.16,<1.17' pytest mypy websockets boto3 hypothesis
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
  .venv/bin/maturin develop -q -m bindings/python/Cargo.toml "$@"
