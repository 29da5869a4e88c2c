#!/usr/bin/env bash
# Fleet test: real worker processes and signals against the local engine, with short leases
# (3 s lease, 1 s renew, 0.5 s skew). One worker is killed (SIGKILL), one frozen past its
# deadline (SIGSTOP) and thawed (SIGCONT), one stopped (SIGTERM). Asserts no double ownership,
# no gaps, no write from the thawed worker, crash failover <= lease + skew + 3 s and graceful
# hand-over <= 2 s, and the SIGTERMed worker exits within the hint wait (5 s, the worker's
# default; shutdown drains the long poll in flight) + 1 s. Needs AWS_ENDPOINT_URL (run through
# scripts/with-services.sh). Runs once per lease mode in FLEET_MODES (default: per-item, then
# session: one heartbeat per worker).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AWS_ENDPOINT_URL:?run through scripts/with-services.sh}"
LEASE_MS=3000 RENEW_MS=1000 SKEW_MS=500 HINT_WAIT_MS=5000
BIN=${LEASELOCK_BIN:-target/debug/leaselock}
[[ -x $BIN ]] || cargo build -q -p leaselock-cli
log=$(mktemp)
trap 'rm -f "$log"' EXIT
overall=0
for mode in ${FLEET_MODES:-per-item session}; do
echo "fleet: mode $mode"
status=0
"$BIN" --lease-ms $LEASE_MS --renew-ms $RENEW_MS --skew-ms $SKEW_MS --mode "$mode" demo --zombie \
  --connections 18 --rate 2 --settle-secs 3 --orphan-interval-ms 1000 --desired-state-interval-ms 1000 \
  --dir "target/fleet-logs/$mode" | tee "$log" || status=$?
report=$(tail -n 1 "$log")
python3 - "$report" "$status" "$LEASE_MS" "$SKEW_MS" "$HINT_WAIT_MS" <<'PY' || overall=1
import json, sys
report, status, lease, skew, hint_wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
try:
    r = json.loads(report)
except ValueError:
    print(f"fleet: no JSON report (exit {status}): {report!r}")
    print("0 passed, 1 failed")
    sys.exit(1)
checks = [
    ("demo reports ok and exits 0", r.get("demo") == "ok" and status == 0),
    ("no double owner", r["double_owner"] == 0),
    ("no gaps", r["gaps"] == 0),
    ("messages were written", r["messages"] > 18 * 4),
    ("no write from the thawed worker after takeover", r.get("zombie_writes_accepted") == 0),
    (f"crash failover {r['crash_failover_max_ms']} ms <= {lease + skew + 3000}", 0 < r["crash_failover_max_ms"] <= lease + skew + 3000),
    (f"zombie takeover {r.get('zombie_failover_max_ms')} ms <= {lease + skew + 3000}", 0 < (r.get("zombie_failover_max_ms") or 0) <= lease + skew + 3000),
    (f"graceful hand-over {r['graceful_handover_max_ms']} ms <= 2000", r["graceful_handover_max_ms"] <= 2000),
    (f"SIGTERMed worker exited {r.get('sigterm_exit_ms')} ms after the signal <= {hint_wait + 1000}", 0 < (r.get("sigterm_exit_ms") or 0) <= hint_wait + 1000),
]
failed = 0
for name, ok in checks:
    print(("ok     " if ok else "FAILED ") + name)
    failed += not ok
print(f"fleet: {len(checks) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
done
exit $overall
