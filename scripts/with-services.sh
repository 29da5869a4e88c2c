#!/usr/bin/env bash
# Runs a command with the local AWS engine up, and stops the engine afterwards if this script
# started it. The command sees AWS_ENDPOINT_URL and a dummy region and credentials.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${MOTO_PORT:-4566}"
started=0
if ! curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/moto-api/"; then
  scripts/services.sh start
  started=1
fi
# Redis for the election tests, on its own port; stopped afterwards if started here.
REDIS_PORT="${REDIS_PORT:-6390}"
export REDIS_PORT
redis_started=0
if [[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" != PONG ]]; then
  scripts/redis.sh start
  redis_started=1
fi
cleanup() {
  if ((redis_started)); then scripts/redis.sh stop; fi
  if ((started)); then scripts/services.sh stop; fi
}
trap cleanup EXIT
export LEASELOCK_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
export LEASELOCK_REQUIRE_SERVICES=1
"$@"
