#!/usr/bin/env bash
# Measures one reconciler run over 10,000 orphans and records it in bench-results/reconciler.txt
# (lambdas/benches/reconciler.rs says what is measured and why).
# The run gets a local engine (moto) of its own on a free loopback port, so other test suites
# sharing the default engine do not skew it; it is stopped by its pid at the end.
# Knobs: LEASELOCK_BENCH_ORPHANS, LEASELOCK_BENCH_CONSUMERS, LEASELOCK_BENCH_CONCURRENCY.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scripts/venv.sh
if [[ ! -x .venv/bin/moto_server ]]; then
  echo "bench: installing moto server into .venv"
  .venv/bin/pip install -q 'moto[server]' boto3
fi

port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
.venv/bin/moto_server -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
moto=$!
stop() {
  kill "$moto" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$moto" 2>/dev/null || break; sleep 0.1; done
  rm -f "$log"
}
trap stop EXIT
deadline=$((SECONDS + 30))
until curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/moto-api/"; do
  kill -0 "$moto" 2>/dev/null || { cat "$log" >&2; echo "bench: moto exited" >&2; exit 1; }
  ((SECONDS < deadline)) || { echo "bench: moto did not answer within 30 s" >&2; exit 1; }
  sleep 0.2
done

export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
export LEASELOCK_REQUIRE_SERVICES=1
cargo bench -p leaselock-lambdas --bench reconciler
