#!/usr/bin/env bash
# make bench, failover section: crash failover (SIGKILL) and graceful hand-over (SIGTERM)
# distributions over forced failures of real worker processes (cli/src/failover.rs), each kind on
# a local engine of its own, both at once; then session-mode crash failover at the cheap setting,
# alone on a third engine; bench/failover.py summarises and merges the keys.
#
# Per-item crash rounds wait for leases to expire, so they run with every timing knob scaled down
# by the same factor (lease 5 s, renew 1.25 s, skew 0.25 s, orphan query 0.5 s = the defaults / 4)
# and the figures are scaled back up to the default 20 s lease. (A 2 s lease gives more samples per
# minute, but on a loaded 2-core machine the local engine's answers then take a sizeable part of
# the lease and renewals miss their deadlines.) Hand-overs do not wait for expiry: they run at the
# defaults, unscaled. Session-mode crash rounds run at that same 5 s session lease (renew 1.25 s,
# skew 0.25 s, orphan query 0.5 s), unscaled: with one heartbeat per worker that short lease is the
# cheap setting, so it is measured as it is, with 100 connections per worker.
#
# The engines run with DynamoDB's per-partition limits (1,000 write and 3,000 read units/s per
# partition key value; scripts/partition_limits.py), so they also count the lease table's writes:
# the crash runs count them over a steady window before their first round (writes per
# connection-hour).
# Knobs: LEASELOCK_BENCH_FAILURES (50 per kind), LEASELOCK_BENCH_CRASH_LEASE_MS (5000),
# LEASELOCK_BENCH_SESSION_FAILURES (20), LEASELOCK_BENCH_SESSION_CONNECTIONS (300, 3 workers),
# LEASELOCK_BENCH_STEADY_MS (20000), FAILOVER_CRASH_PORT (4584), FAILOVER_GRACEFUL_PORT (4585),
# FAILOVER_SESSION_PORT (4586); LEASELOCK_BENCH_PROFILE=dev runs the test build of the CLI (the
# rounds time leases and requests, not the workers' CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${LEASELOCK_BENCH_PROFILE:-release}" == dev ]]; then
  cargo build -q -p leaselock-cli
  bin="${CARGO_TARGET_DIR:-target}/debug/leaselock"
else
  cargo build --release -q -p leaselock-cli
  bin="${CARGO_TARGET_DIR:-target}/release/leaselock"
fi
scripts/venv.sh
failures="${LEASELOCK_BENCH_FAILURES:-50}"
session_failures="${LEASELOCK_BENCH_SESSION_FAILURES:-20}"
session_connections="${LEASELOCK_BENCH_SESSION_CONNECTIONS:-300}"
steady="${LEASELOCK_BENCH_STEADY_MS:-20000}"
lease="${LEASELOCK_BENCH_CRASH_LEASE_MS:-5000}"
# The defaults: lease 20000, renew 5000, skew 1000, orphan query 2000 (ms).
renew=$((lease / 4)) skew=$((lease / 20)) orphan=$((lease / 10))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export out failures session_failures session_connections steady lease renew skew orphan bin
export LEASELOCK_PARTITION_WCU=1000 LEASELOCK_PARTITION_RCU=3000
# The graceful run's engine is nested in the crash run's, so the Redis both wrappers check is
# started (if at all) once.
MOTO_PORT="${FAILOVER_CRASH_PORT:-4584}" scripts/with-services.sh bash -c '
  "$bin" --lease-ms "$lease" --renew-ms "$renew" --clock-skew-ms "$skew" \
    bench-failover --kind crash --failures "$failures" --orphan-interval-ms "$orphan" \
    --steady-ms "$steady" >"$out/crash.json" &
  crash=$!
  MOTO_PORT="${FAILOVER_GRACEFUL_PORT:-4585}" scripts/with-services.sh \
    "$bin" bench-failover --kind graceful --failures "$failures" >"$out/graceful.json"
  wait "$crash"
'
# Session mode at the 5 s session lease, unscaled: 3 workers of 100 connections (a message every
# 50 s per stream, so the engine serves the leases rather than the feed).
MOTO_PORT="${FAILOVER_SESSION_PORT:-4586}" scripts/with-services.sh \
  "$bin" --lease-ms 5000 --renew-ms 1250 --clock-skew-ms 250 --mode session \
  bench-failover --kind crash --failures "$session_failures" --orphan-interval-ms 500 \
  --connections "$session_connections" --workers 3 --rate 0.02 --steady-ms "$steady" >"$out/session.json"
python3 bench/failover.py "$out/crash.json" "$out/graceful.json" "$out/session.json"
