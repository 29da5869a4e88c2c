#!/usr/bin/env bash
# Fleet test: real worker processes and signals against the local engine, with short leases
# (3 s lease, 1 s renew, 0.5 s skew). Each run is a mixed fleet on one table: a Rust
# (`leaselock worker`), a Python (examples/python_worker.py) and a Node (examples/node_worker.mjs)
# worker. One worker is killed (SIGKILL), one frozen past its deadline (SIGSTOP) and thawed
# (SIGCONT), one stopped (SIGTERM). Asserts per run: no double ownership, no gaps, no write from
# the thawed worker, crash failover <= lease + skew + 3 s and graceful hand-over <= 2 s, the
# SIGTERMed worker exits within the hint wait (5 s, every worker's default; shutdown drains the
# long poll in flight) + 1 s with exit status 0 (as every worker stopped at the end), and each
# signal hit the language it was aimed at. Across the runs:
# every language was killed, frozen and terminated at least once.
# Needs AWS_ENDPOINT_URL (run through scripts/with-services.sh), the Python binding in .venv
# (scripts/python-binding.sh) and the Node package (scripts/build-wasm.sh): `make test-fleet`.
# FLEET_RUNS lists the runs as MODE:KILLED,FROZEN,TERMINATED (the victims' languages, rotated so
# each language takes each signal once; both lease modes).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AWS_ENDPOINT_URL:?run through scripts/with-services.sh}"
LEASE_MS=3000 RENEW_MS=1000 SKEW_MS=500 HINT_WAIT_MS=5000
LANGUAGES=rust,python,node
RUNS=${FLEET_RUNS:-per-item:rust,python,node session:python,node,rust per-item:node,rust,python}
BIN=${LEASELOCK_BIN:-target/debug/leaselock}
[[ -x $BIN ]] || cargo build -q -p leaselock-cli
log=$(mktemp)
reports=$(mktemp)
trap 'rm -f "$log" "$reports"' EXIT
overall=0
n=0
for run in $RUNS; do
mode=${run%%:*} victims=${run#*:}
n=$((n + 1))
echo "fleet: run $n, mode $mode, SIGKILL/SIGSTOP/SIGTERM on $victims"
status=0
"$BIN" --lease-ms $LEASE_MS --renew-ms $RENEW_MS --clock-skew-ms $SKEW_MS --mode "$mode" demo --zombie \
  --languages "$LANGUAGES" --victims "$victims" \
  --connections 18 --rate 2 --settle-secs 3 --orphan-interval-ms 1000 --desired-state-interval-ms 1000 \
  --dir "target/fleet-logs/$n-$mode" | tee "$log" || status=$?
report=$(tail -n 1 "$log")
echo "$report" >>"$reports"
python3 - "$report" "$status" "$LEASE_MS" "$SKEW_MS" "$HINT_WAIT_MS" "$LANGUAGES" "$victims" <<'PY' || overall=1
import json, sys
report, status, lease, skew, hint_wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
languages, victims = sys.argv[6].split(","), sys.argv[7].split(",")
try:
    r = json.loads(report)
except ValueError:
    print(f"fleet: no JSON report (exit {status}): {report!r}")
    print("0 passed, 1 failed")
    sys.exit(1)
hit = [r.get("killed"), r.get("frozen"), r.get("terminated")]
checks = [
    ("demo reports ok and exits 0", r.get("demo") == "ok" and status == 0),
    (f"languages {r.get('languages')} == {languages}", r.get("languages") == languages),
    (f"SIGKILL, SIGSTOP, SIGTERM hit {hit} == {victims}", hit == victims),
    ("every SIGTERMed worker exited with status 0", r.get("unclean_exits") == 0),
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
# Across the runs, from the reports (not from what was asked for): each language took each signal.
python3 - "$reports" "$LANGUAGES" <<'PY' || overall=1
import json, sys
reports = []
for line in open(sys.argv[1]):
    try:
        reports.append(json.loads(line))
    except ValueError:
        pass
failed = total = 0
for role, signal in (("killed", "SIGKILL"), ("frozen", "SIGSTOP + SIGCONT"), ("terminated", "SIGTERM")):
    for language in sys.argv[2].split(","):
        runs = [i + 1 for i, r in enumerate(reports) if r.get(role) == language and r.get("demo") == "ok"]
        ok = bool(runs)
        total += 1
        print(("ok     " if ok else "FAILED ") + f"{signal} hit {language} in a passing run (runs {runs})")
        failed += not ok
print(f"fleet: across {len(reports)} runs: {total - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
exit $overall
