#!/usr/bin/env bash
# Runs examples/python_worker.py against the local feed and engine: two workers one after the
# other (the second resumes after the first's last checkpoint), then checks every stream's
# messages are contiguous from 1 with no duplicate delivery. Once per lease mode (per-item, then
# session: LEASELOCK_MODE, as for `leaselock worker`). Needs the engine (with-services.sh) and a
# built CLI (target/debug/leaselock).
set -euo pipefail
cd "$(dirname "$0")/.."
L=target/debug/leaselock
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

example() {
export LEASELOCK_MODE=$1
run=$RANDOM$RANDOM
export LEASELOCK_TABLE=pyex-$run LEASELOCK_MESSAGES_TABLE=pyex-msgs-$run LEASELOCK_LEASE_MS=3000
export LEASELOCK_RENEW_MS=1000 LEASELOCK_CLOCK_SKEW_MS=500 LEASELOCK_ORPHAN_INTERVAL_MS=300
$L table create >/dev/null
# The feed binds a port of the system's choosing (a random fixed one may be taken) and says
# which on its first line: `upstream: ws://127.0.0.1:PORT (...)`.
feedlog=$(mktemp)
$L upstream --listen 127.0.0.1:0 --rate 20 >/dev/null 2>"$feedlog" &
pids+=($!)
addr=
for _ in $(seq 1 100); do
  addr=$(sed -n 's|^upstream: ws://\([0-9.:]*\) .*|\1|p' "$feedlog" | head -n 1)
  [[ -n $addr ]] && break
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "the local feed exited: $(cat "$feedlog")" >&2; exit 1; }
  sleep 0.1
done
[[ -n $addr ]] || { echo "the local feed did not start within 10 s" >&2; exit 1; }
rm -f "$feedlog"
for s in s1 s2 s3; do $L start $s --url "ws://$addr/$s" >/dev/null; done

# Each worker runs until its streams have moved `$1` messages past where they started.
work() {
  .venv/bin/python examples/python_worker.py >/dev/null &
  local w=$!
  pids+=("$w")
  .venv/bin/python - "$1" <<'PY'
import os, sys, time
import leaselock
t = leaselock.LeaseTable(os.environ["LEASELOCK_TABLE"])
want, until = int(sys.argv[1]), time.monotonic() + 30
while time.monotonic() < until:
    if all((t.get(s).last_seq or 0) >= want for s in ("s1", "s2", "s3")):
        sys.exit(0)
    time.sleep(0.1)
sys.exit("the streams did not reach %d within 30 s" % want)
PY
  kill -TERM "$w"
  wait "$w"
}
work 20
work 40

.venv/bin/python - <<'PY'
import os, boto3
import leaselock
c = boto3.client("dynamodb")
t = leaselock.LeaseTable(os.environ["LEASELOCK_TABLE"], mode=os.environ["LEASELOCK_MODE"])
session = t.mode == "session"
rows = c.scan(TableName=os.environ["LEASELOCK_MESSAGES_TABLE"])["Items"]
for s in ("s1", "s2", "s3"):
    item = t.get(s)
    got = sorted((int(r["seq"]["N"]), int(r["writes"]["N"]), int(r["fence"]["N"])) for r in rows if r["stream"]["S"] == s)
    seqs = [g[0] for g in got]
    assert seqs == list(range(1, len(seqs) + 1)), (s, seqs)
    assert all(g[1] == 1 for g in got), (s, "duplicate delivery")
    # Released: per item (expiry 0), or in session mode by the end of the worker's session.
    assert item.fence == 2 and item.last_seq == seqs[-1], item
    assert item.expires_at_ms == (32_503_680_000_000 if session else 0), item
    assert {g[2] for g in got} == {1, 2}, "both workers wrote"
    print(f"python_worker ({os.environ['LEASELOCK_MODE']}): {s}: {len(seqs)} messages, contiguous, no duplicates, fences 1 and 2, released")
if session:
    ended = t.sessions()
    # The first worker's session may be retired already (dead, nothing left under it).
    assert ended and all(s.expires_at_ms == 0 for s in ended), ended
    print("python_worker (session): every session ended")
PY
kill "${pids[0]}"
pids=()
}

example per-item
example session
