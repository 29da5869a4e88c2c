#!/usr/bin/env bash
# Checks the deployment side offline: the SAM template (cfn-lint, sam validate --lint, sam build),
# the CDK app (type check, synth under cdk-nag, assertion tests), that both deploy the same
# coordinator (sam-parity.py), and cfn-lint on what CDK synthesized.
# Tools come from .venv and infra/node_modules: scripts/install-infra-tools.sh installs them.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$root/.venv/bin"
node_bin="$root/infra/node_modules/.bin"
for tool in "$venv/cfn-lint" "$venv/sam" "$venv/cargo-lambda" "$node_bin/cdk"; do
  if [[ ! -x "$tool" ]]; then
    echo "infra: $tool is missing: run scripts/install-infra-tools.sh" >&2
    exit 1
  fi
done
# cargo-lambda and the zig it cross-compiles with live in the venv.
export PATH="$venv:$node_bin:$PATH"
export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export SAM_CLI_TELEMETRY=0 CDK_DISABLE_CLI_TELEMETRY=true
export CDK_DEFAULT_ACCOUNT=123456789012 CDK_DEFAULT_REGION=us-east-1

timings=()
step() {
  local name="$1"
  shift
  echo "==> $name"
  local start=$SECONDS
  if ! "$@"; then
    echo "infra: FAILED: $name" >&2
    exit 1
  fi
  timings+=("$(printf '%4d s  %s' $((SECONDS - start)) "$name")")
}

# The CDK app deploys the bootstraps `cargo lambda build --release --arm64` leaves in target/lambda
# (sam build leaves them there too); without them it synthesizes with empty placeholders.
cdk_synth() {
  local code=()
  if [[ ! -f target/lambda/router/bootstrap || ! -f target/lambda/reconciler/bootstrap ]]; then
    local placeholders
    placeholders="$(mktemp -d)"
    mkdir "$placeholders/router" "$placeholders/reconciler"
    touch "$placeholders/router/bootstrap" "$placeholders/reconciler/bootstrap"
    echo "infra: no bootstraps in target/lambda: synthesizing with placeholders"
    code=(-c "routerCodeDir=$placeholders/router" -c "reconcilerCodeDir=$placeholders/reconciler")
  fi
  (cd infra && rm -rf cdk.out && cdk synth --quiet --no-notices "${code[@]}" \
    -c workerImage=123456789012.dkr.ecr.us-east-1.amazonaws.com/leaselock-worker:latest)
}

step "cfn-lint template.yaml" cfn-lint template.yaml
step "sam validate --lint" sam validate --lint --template-file template.yaml --region us-east-1
if [[ -f lambdas/Cargo.toml ]]; then
  step "sam build" sam build --template-file template.yaml
else
  echo "infra: SKIPPED sam build: lambdas/Cargo.toml does not exist yet"
fi
step "tsc (type check)" bash -c "cd infra && tsc -p ."
step "cdk synth (with cdk-nag AwsSolutions)" cdk_synth
step "SAM/CDK parity" python infra/sam-parity.py template.yaml infra/cdk.out/Leaselock.template.json
step "cdk tests" bash -c "cd infra && npm test --silent"
step "cfn-lint infra/cdk.out" bash -c 'cfn-lint --ignore-checks W3005 -- infra/cdk.out/*.template.json'

echo "infra: all checks passed"
printf '%s\n' "${timings[@]}"
