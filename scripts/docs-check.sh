#!/usr/bin/env bash
# make docs-check: every page of the built manual (target/docs, `make docs` first) opened in
# headless Chromium (scripts/docs-check.py); installs Debian's chromium when missing (about a
# minute) and websockets into .venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -s target/docs/index.html ]] || { echo "docs-check: no manual in target/docs: run make docs first" >&2; exit 1; }
if ! command -v chromium >/dev/null; then
  echo "docs-check: installing chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
scripts/venv.sh
.venv/bin/python -c 'import websockets.sync.client' 2>/dev/null || .venv/bin/pip install -q 'websockets>=12'
.venv/bin/python scripts/docs-check.py "$(command -v chromium)" target/docs
