#!/usr/bin/env bash
# Local AWS engine (moto server: DynamoDB, SQS, CloudWatch) on loopback, and the local Redis
# (scripts/redis.sh, port REDIS_PORT, default 6390).
#   scripts/services.sh start   install into .venv if missing, start, wait until it answers
#   scripts/services.sh stop    stop the server this script started (by its pid)
#   scripts/services.sh status
#   scripts/services.sh install only install what is missing (.venv, moto)
#   scripts/services.sh acquire|release PID   moto only, shared between wrappers (service-lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${MOTO_PORT:-4566}"
NAME=moto
WHERE="http://127.0.0.1:$PORT"
STATE=.services
# shellcheck source=scripts/service-lib.sh
source scripts/service-lib.sh

answers() { curl -fs -o /dev/null --max-time 1 "$WHERE/moto-api/" 2>/dev/null; }

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
  launch 30 0.2 .venv/bin/python scripts/local_engine.py -H 127.0.0.1 -p "$PORT"
}

case "${1:-start}" in
  start) start; scripts/redis.sh start ;;
  stop) stop; scripts/redis.sh stop ;;
  status) status || exit 1; scripts/redis.sh status ;;
  install) install ;;
  acquire | release) "$1" "${2:?a user pid}" ;;
  *) echo "usage: $0 start|stop|status|install|acquire PID|release PID" >&2; exit 2 ;;
esac
