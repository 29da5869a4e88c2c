#!/usr/bin/env bash
# Index lag test (session mode, real worker processes): the local engine's owner index answers
# as it was 8 s ago (longer than the 5 s session lease) and its orphan index 1 s ago
# (LEASELOCK_ENGINE_INDEX_LAG_MS, set by `make test-fleet` for the engine it starts). Each round
# STARTs a stream and hints it, SIGKILLs its claimer as soon as the claim has landed (before the
# owner index lists it under the claimer), and starts a replacement (`leaselock bench-failover --kind
# fresh`: 3 workers, lease 5 s, renew 1.25 s, skew 250 ms, orphan query every 2 s, the workers'
# index-lag allowance at its 10 s default). Asserts from the JSON report: no stream stranded,
# and each claimed again within lease + skew + the index's lag + one orphan interval + 1 s.
# Needs AWS_ENDPOINT_URL (run through scripts/with-services.sh) on an engine with that lag.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AWS_ENDPOINT_URL:?run through scripts/with-services.sh}"
LEASE_MS=5000 RENEW_MS=1250 SKEW_MS=250 ORPHAN_MS=2000 OWNER_INDEX_LAG_MS=${OWNER_INDEX_LAG_MS:-8000}
ROUNDS=${INDEX_LAG_ROUNDS:-5}
BIN=${LEASELOCK_BIN:-target/debug/leaselock}
[[ -x $BIN ]] || cargo build -q -p leaselock-cli
lags=$(curl -fsS "$AWS_ENDPOINT_URL/_leaselock/index-lag")
python3 - "$lags" "$OWNER_INDEX_LAG_MS" <<'PY'
import json, sys
lags, want = json.loads(sys.argv[1]), int(sys.argv[2])
owner = lags["indexes"].get("lease_owner-index", lags["default_ms"])
if owner != want:
    sys.exit(f"index lag: the engine's owner index lags {owner} ms, not {want} (start it with LEASELOCK_ENGINE_INDEX_LAG_MS)")
print(f"index lag: the engine's owner index lags {owner} ms, its other indexes {lags['default_ms']} ms")
PY
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$BIN" --lease-ms $LEASE_MS --renew-ms $RENEW_MS --clock-skew-ms $SKEW_MS --mode session bench-failover --kind fresh \
  --failures "$ROUNDS" --connections 0 --workers 3 --orphan-interval-ms $ORPHAN_MS \
  --dir target/fleet-logs/index-lag | tee "$log" || status=$?
python3 - "$(tail -n 1 "$log")" "$status" "$ROUNDS" $((LEASE_MS + SKEW_MS + OWNER_INDEX_LAG_MS + ORPHAN_MS + 1000)) <<'PY'
import json, sys
report, status, rounds, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    r = json.loads(report)
except ValueError:
    print(f"index lag: no JSON report (exit {status}): {report!r}")
    print("0 passed, 1 failed")
    sys.exit(1)
samples = r["samples_ms"]
checks = [
    ("the bench exited 0", status == 0),
    (f"{r['stranded']} of {rounds} streams stranded", r["stranded"] == 0 and len(samples) == rounds),
    (f"claimed again after {samples} ms, each <= {bound}", bool(samples) and max(samples) <= bound),
]
failed = 0
for name, ok in checks:
    print(("ok     " if ok else "FAILED ") + name)
    failed += not ok
print(f"index lag: {len(checks) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
