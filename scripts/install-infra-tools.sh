#!/usr/bin/env bash
# Installs what the infra checks need: cfn-lint, the SAM CLI and cargo-lambda in the project's
# .venv, the arm64 Rust target for `sam build`, and the CDK app's npm dependencies.
# Safe to run repeatedly: each step is skipped when its result is already in place.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ ! -x .venv/bin/python ]]; then
  echo "infra-tools: creating .venv"
  python3 -m venv .venv
fi

missing=()
[[ -x .venv/bin/cfn-lint ]] || missing+=(cfn-lint)
[[ -x .venv/bin/sam ]] || missing+=(aws-sam-cli)
[[ -x .venv/bin/cargo-lambda ]] || missing+=(cargo-lambda)
if ((${#missing[@]})); then
  echo "infra-tools: pip install ${missing[*]}"
  .venv/bin/pip install --quiet "${missing[@]}"
else
  echo "infra-tools: cfn-lint, sam and cargo-lambda present"
fi

arm_target=aarch64-unknown-linux-gnu
if rustup target list --installed | grep -qx "$arm_target"; then
  echo "infra-tools: rust target $arm_target present"
else
  echo "infra-tools: rustup target add $arm_target"
  rustup target add "$arm_target"
fi

if [[ ! -d infra/node_modules || infra/package-lock.json -nt infra/node_modules ]]; then
  echo "infra-tools: npm ci in infra/"
  (cd infra && npm ci --no-audit --no-fund)
  # Marks the install time for the staleness check above.
  touch infra/node_modules
else
  echo "infra-tools: infra/node_modules up to date"
fi
