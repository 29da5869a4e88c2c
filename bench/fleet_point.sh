#!/usr/bin/env bash
# make bench, fleet-point section: one point of the fleet simulation's curve run by real worker
# processes, and the simulation run at the same settings beside it (bench/fleet_point.py merges
# both under `fleet_point`; the report shows them side by side).
#
# The point is session mode at the 5 s session lease (renew 1.25 s, skew 0.25 s, orphan query
# 0.5 s), 400 streams on 8 worker processes (each may hold 58: the 7 left after a failure hold
# them all) over an orphan index of 4 shards: 100 streams per orphan-index partition value, where
# 100,000 connections on 64 shards put 1,562.5. So the partition limits are scaled down by that
# factor, 15.625: 64 write and 192 read units per second per partition value (DynamoDB's 1,000
# and 3,000 / 15.625), enforced by the local engine (scripts/partition_limits.py) and by the
# simulation alike. Real processes: crash rounds (SIGKILL of the busiest worker) and graceful
# rounds (SIGTERM), each timed per round from the signal until every stream of the victim runs
# on another worker (cli/src/failover.rs, `per_failure_max_ms`). The simulation: the same fleet,
# the crash of one worker and the rolling replacement of five, timed the same way.
# Knobs: LEASELOCK_BENCH_POINT_FAILURES (8 per kind), FLEET_POINT_PORT (4587).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p leaselock-cli
cargo build --release -q -p leaselock --no-default-features --features sim --example fleet_sim
bin="${CARGO_TARGET_DIR:-target}/release/leaselock"
sim="${CARGO_TARGET_DIR:-target}/release/examples/fleet_sim"
scripts/venv.sh
failures="${LEASELOCK_BENCH_POINT_FAILURES:-8}"
connections=400 workers=8 shards=4 wcu=64 rcu=192
max=$(( (connections + workers - 2) / (workers - 1) ))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export out failures connections workers bin
export LEASELOCK_PARTITION_WCU=$wcu LEASELOCK_PARTITION_RCU=$rcu LEASELOCK_ORPHAN_SHARDS=$shards
MOTO_PORT="${FLEET_POINT_PORT:-4587}" scripts/with-services.sh bash -c '
  for kind in crash graceful; do
    "$bin" --lease-ms 5000 --renew-ms 1250 --clock-skew-ms 250 --mode session \
      bench-failover --kind "$kind" --failures "$failures" --orphan-interval-ms 500 \
      --connections "$connections" --workers "$workers" --rate 0.02 \
      --dir target/bench-fleet-point >"$out/$kind.json"
  done
'
FLEET_SIM_MODES=session-5s FLEET_SIM_SESSION_SHARDS=$shards FLEET_SIM_ORPHAN_INTERVAL_MS=500 \
  FLEET_SIM_PARTITION_WCU=$wcu FLEET_SIM_PARTITION_RCU=$rcu \
  nice -n 10 "$sim" "$connections" "$workers" "$max" 5 "" >"$out/sim.json"
python3 bench/fleet_point.py "$out/crash.json" "$out/graceful.json" "$out/sim.json" \
  "{\"scale\": $(python3 -c "print(100000 / 64 / ($connections / $shards))"), \"write_units_per_s\": $wcu, \"read_units_per_s\": $rcu, \"orphan_shards\": $shards, \"max_connections\": $max}"
