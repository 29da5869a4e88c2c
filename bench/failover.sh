#!/usr/bin/env bash
# make bench, failover section: crash failover (SIGKILL) and graceful hand-over (SIGTERM)
# distributions over forced failures of real worker processes (cli/src/failover.rs), each kind on
# a local engine of its own, both at once; bench/failover.py summarises and merges the keys.
#
# Crash rounds wait for leases to expire, so they run with every timing knob scaled down by the
# same factor (lease 5 s, renew 1.25 s, skew 0.25 s, orphan query 0.5 s = the defaults / 4) and the
# figures are scaled back up to the default 20 s lease. (A 2 s lease gives more samples per
# minute, but on a loaded 2-core machine the local engine's answers then take a sizeable part of
# the lease and renewals miss their deadlines.) Hand-overs do not wait for expiry: they run at the
# defaults, unscaled.
# Knobs: LEASELOCK_BENCH_FAILURES (50 per kind), LEASELOCK_BENCH_CRASH_LEASE_MS (5000),
# FAILOVER_CRASH_PORT (4584), FAILOVER_GRACEFUL_PORT (4585); LEASELOCK_BENCH_PROFILE=dev runs the
# test build of the CLI (the rounds time leases and requests, not the workers' CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${LEASELOCK_BENCH_PROFILE:-release}" == dev ]]; then
  cargo build -q -p leaselock-cli
  bin=target/debug/leaselock
else
  cargo build --release -q -p leaselock-cli
  bin=target/release/leaselock
fi
scripts/venv.sh
failures="${LEASELOCK_BENCH_FAILURES:-50}"
lease="${LEASELOCK_BENCH_CRASH_LEASE_MS:-5000}"
# The defaults: lease 20000, renew 5000, skew 1000, orphan query 2000 (ms).
renew=$((lease / 4)) skew=$((lease / 20)) orphan=$((lease / 10))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export out failures lease renew skew orphan bin
# The graceful run's engine is nested in the crash run's, so the Redis both wrappers check is
# started (if at all) once.
MOTO_PORT="${FAILOVER_CRASH_PORT:-4584}" scripts/with-services.sh bash -c '
  "$bin" --lease-ms "$lease" --renew-ms "$renew" --skew-ms "$skew" \
    bench-failover --kind crash --failures "$failures" --orphan-interval-ms "$orphan" >"$out/crash.json" &
  crash=$!
  MOTO_PORT="${FAILOVER_GRACEFUL_PORT:-4585}" scripts/with-services.sh \
    "$bin" bench-failover --kind graceful --failures "$failures" >"$out/graceful.json"
  wait "$crash"
'
python3 bench/failover.py "$out/crash.json" "$out/graceful.json"
