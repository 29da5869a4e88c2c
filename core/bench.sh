#!/usr/bin/env bash
# Write cost of per-item and session leases side by side (core/benches/write_cost.rs says what is
# counted); writes bench/results/latest.json. The run gets a local engine of its own on a free
# loopback port (scripts/with-services.sh starts it and stops it by its pid).
# Knobs: LEASELOCK_BENCH_CONNECTIONS, LEASELOCK_BENCH_WORKERS, LEASELOCK_BENCH_HOLD_S;
# LEASELOCK_BENCH_PROFILE=dev reuses the test build (request counts do not depend on it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/venv.sh
port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
MOTO_PORT="$port" scripts/with-services.sh cargo bench -p leaselock --bench write_cost ${LEASELOCK_BENCH_PROFILE:+--profile "$LEASELOCK_BENCH_PROFILE"}
