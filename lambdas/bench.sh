#!/usr/bin/env bash
# Measures one reconciler run over 10,000 orphans and records it in bench-results/reconciler.txt
# (lambdas/benches/reconciler.rs says what is measured and why).
# The run gets a local engine of its own on a free loopback port, so other suites sharing the
# default one do not skew it; scripts/with-services.sh starts it and stops it by its pid.
# Knobs: LEASELOCK_BENCH_ORPHANS, LEASELOCK_BENCH_CONSUMERS, LEASELOCK_BENCH_WAIT_S,
# LEASELOCK_BENCH_CONCURRENCY.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/venv.sh
port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
MOTO_PORT="$port" scripts/with-services.sh cargo bench -p leaselock-lambdas --bench reconciler
