#!/usr/bin/env bash
# Local AWS engine (moto server: DynamoDB, SQS, CloudWatch) on loopback, and the local Redis
# (scripts/redis.sh, port REDIS_PORT, default 6390).
#   scripts/services.sh start   install into .venv if missing, start, wait until it answers
#   scripts/services.sh stop    stop the server this script started (by its pid)
#   scripts/services.sh status
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${MOTO_PORT:-4566}"
STATE=.services
PIDFILE="$STATE/moto-$PORT.pid"
URL="http://127.0.0.1:$PORT"

answers() { curl -fs -o /dev/null --max-time 1 "$URL/moto-api/" 2>/dev/null; }
ours() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# scripts/local_engine.py patches moto's internals: the version it was written against.
MOTO_VERSION=5.2.5

install() {
  scripts/venv.sh
  if [[ "$(.venv/bin/python -c 'import moto; print(moto.__version__)' 2>/dev/null)" != "$MOTO_VERSION" ]]; then
    echo "services: installing moto server $MOTO_VERSION into .venv"
    .venv/bin/pip install -q "moto[server]==$MOTO_VERSION" boto3
  fi
}

start() {
  if answers; then
    echo "services: moto already answering on $URL"
    return 0
  fi
  install
  mkdir -p "$STATE"
  echo "services: starting moto on $URL"
  nohup .venv/bin/python scripts/local_engine.py -H 127.0.0.1 -p "$PORT" >"$STATE/moto-$PORT.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 150); do
    if answers; then
      echo "services: moto ready (pid $(cat "$PIDFILE"))"
      return 0
    fi
    ours || { echo "services: moto exited; log follows" >&2; cat "$STATE/moto-$PORT.log" >&2; return 1; }
    sleep 0.2
  done
  echo "services: moto did not answer on $URL within 30 s" >&2
  return 1
}

stop() {
  if ours; then
    local pid
    pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "services: moto stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  start) start; scripts/redis.sh start ;;
  stop) stop; scripts/redis.sh stop ;;
  status) if answers; then echo "moto answering on $URL"; else echo "moto not running"; exit 1; fi; scripts/redis.sh status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
