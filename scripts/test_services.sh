#!/usr/bin/env bash
# Two scripts/with-services.sh wrappers started at the same moment on the same ports share one
# engine and one Redis: only one of each is started, the wrapper that finishes first leaves them
# to the other, and the last one stops them. Ports of its own; bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
export MOTO_PORT="${TEST_SERVICES_MOTO_PORT:-4611}" REDIS_PORT="${TEST_SERVICES_REDIS_PORT:-6411}"
fail() { echo "test_services: FAIL: $*" >&2; exit 1; }
moto_answers() { curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$MOTO_PORT/moto-api/"; }
redis_answers() { [[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; }
# wait_for FILE: polls for FILE for at most 60 s.
wait_for() {
  local _
  for _ in $(seq 1 600); do
    [[ -e $1 ]] && return 0
    sleep 0.1
  done
  echo "test_services: no $1 within 60 s" >&2
  return 1
}
export -f wait_for moto_answers redis_answers

moto_answers && fail "something already answers on port $MOTO_PORT"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export SYNC="$dir"

# A holds its services until B's wrapper has exited, then checks they still answer.
scripts/with-services.sh bash -c 'touch "$SYNC/a-up"; wait_for "$SYNC/b-gone"
  moto_answers && redis_answers' >"$dir/a.log" 2>&1 &
a=$!
scripts/with-services.sh bash -c 'touch "$SYNC/b-up"; wait_for "$SYNC/a-up"' >"$dir/b.log" 2>&1 &
b=$!
wait "$b" || fail "wrapper B failed: $(cat "$dir/b.log")"
touch "$dir/b-gone"
wait "$a" || fail "the services stopped under wrapper A when B finished: $(cat "$dir/a.log")"

starts=$(cat "$dir/a.log" "$dir/b.log" | grep -c 'services: starting' || true)
((starts == 2)) || fail "expected one moto and one Redis started, saw $starts starts: $(cat "$dir"/*.log)"
! moto_answers || fail "moto still answers after the last wrapper finished"
! redis_answers || fail "Redis still answers after the last wrapper finished"
echo "test_services: 1 passed, 0 failed"
