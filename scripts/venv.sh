#!/usr/bin/env bash
# Creates the project's virtualenv (.venv) once; callers install what they need into it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  echo "venv: creating .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
