#!/usr/bin/env bash
# Local Redis for the election tests, on loopback.
#   scripts/redis.sh start   install redis-server (Debian package) if missing, start, wait for PONG
#   scripts/redis.sh stop    stop the server this script started (by its pid)
#   scripts/redis.sh status
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${REDIS_PORT:-6390}"
STATE=.services
PIDFILE="$STATE/redis-$PORT.pid"

answers() { command -v redis-cli >/dev/null && [[ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" == PONG ]]; }
ours() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

install() {
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "services: installing redis-server"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

start() {
  if answers; then
    echo "services: redis already answering on 127.0.0.1:$PORT"
    return 0
  fi
  install
  mkdir -p "$STATE"
  echo "services: starting redis on 127.0.0.1:$PORT"
  nohup redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no \
    --daemonize no --dir "$PWD/$STATE" >"$STATE/redis-$PORT.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 100); do
    if answers; then
      echo "services: redis ready (pid $(cat "$PIDFILE"))"
      return 0
    fi
    ours || { echo "services: redis exited; log follows" >&2; cat "$STATE/redis-$PORT.log" >&2; return 1; }
    sleep 0.1
  done
  echo "services: redis did not answer on port $PORT within 10 s" >&2
  return 1
}

stop() {
  if ours; then
    local pid
    pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "services: redis stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) if answers; then echo "redis answering on 127.0.0.1:$PORT"; else echo "redis not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
