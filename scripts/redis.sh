#!/usr/bin/env bash
# Local Redis for the election tests, on loopback.
#   scripts/redis.sh start   install redis-server (Debian package) if missing, start, wait for PONG
#   scripts/redis.sh stop    stop the server this script started (by its pid)
#   scripts/redis.sh status
#   scripts/redis.sh acquire|release PID   shared between wrappers (service-lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${REDIS_PORT:-6390}"
NAME=redis
WHERE="127.0.0.1:$PORT"
STATE=.services
# shellcheck source=scripts/service-lib.sh
source scripts/service-lib.sh

answers() { command -v redis-cli >/dev/null && [[ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" == PONG ]]; }

install() {
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "services: installing redis-server"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

start() {
  launch 10 0.1 redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no \
    --daemonize no --dir "$PWD/$STATE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  acquire | release) "$1" "${2:?a user pid}" ;;
  *) echo "usage: $0 start|stop|status|acquire PID|release PID" >&2; exit 2 ;;
esac
