#!/usr/bin/env bash
# Runs a command with the local AWS engine and the local Redis up. The command sees
# AWS_ENDPOINT_URL, a dummy region and credentials, and LEASELOCK_REDIS_URL. A server found
# answering is left running; one started here is shared with the wrappers that run meanwhile on
# the same port and stopped by the last of them to finish (scripts/service-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${MOTO_PORT:-4566}"
# Redis for the election tests, on its own port.
REDIS_PORT="${REDIS_PORT:-6390}"
export MOTO_PORT="$PORT" REDIS_PORT
me=$$
cleanup() {
  scripts/redis.sh release "$me" || true
  scripts/services.sh release "$me" || true
}
trap cleanup EXIT
scripts/services.sh acquire "$me"
scripts/redis.sh acquire "$me"
export LEASELOCK_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
export LEASELOCK_REQUIRE_SERVICES=1
"$@"
