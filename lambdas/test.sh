#!/usr/bin/env bash
# The Lambdas' checks (`make test-lambdas`):
#   1. cargo test -p leaselock-lambdas against the local engine (moto);
#   2. the bootstrap binaries built with `cargo lambda build --release` (x86_64);
#   3. each bootstrap run against `cargo lambda watch --only-lambda-apis`, invoked with the sample
#      events in lambdas/events/, every response checked;
#   4. cold start (process start -> first response) of each bootstrap, written to
#      bench-results/cold-start.txt.
# SKIP_CARGO_TEST=1 skips step 1 (when the tests just ran). COLD_RUNS sets the cold starts per function (3).
# Everything listens on 127.0.0.1; every process this script starts is stopped by its pid; every
# wait has a deadline.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Run the whole script with the local engine up (started and stopped by with-services.sh).
if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  exec scripts/with-services.sh "$0" "$@"
fi

COLD_RUNS="${COLD_RUNS:-3}"
log() { printf 'test-lambdas: %s\n' "$*"; }
fail() { printf 'test-lambdas: FAIL: %s\n' "$*" >&2; exit 1; }

# --- tools -------------------------------------------------------------------------------------
scripts/venv.sh
if [[ ! -x .venv/bin/cargo-lambda ]]; then
  log "installing cargo-lambda into .venv"
  .venv/bin/pip install -q cargo-lambda
fi
export PATH="$root/.venv/bin:$PATH"
command -v jq >/dev/null || fail "jq is needed to check responses (apt-get install -y jq)"

# --- 1. tests ------------------------------------------------------------------------------------
log "cargo test -p leaselock-lambdas (local engine at $AWS_ENDPOINT_URL)"
[[ "${SKIP_CARGO_TEST:-}" == 1 ]] || cargo test -p leaselock-lambdas

# --- 2. bootstraps -------------------------------------------------------------------------------
lambda_dir="$root/target/lambda-x86_64"
log "cargo lambda build --release (x86_64) into ${lambda_dir#"$root"/}"
(cd lambdas && cargo lambda build --release --x86-64 --lambda-dir "$lambda_dir")
for f in router reconciler; do
  [[ -x "$lambda_dir/$f/bootstrap" ]] || fail "$lambda_dir/$f/bootstrap was not built"
done

# --- 3. run and invoke -------------------------------------------------------------------------
work="$(mktemp -d)"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:$port"

# A fresh table (with its orphan index) and queue on the local engine.
read -r table queue_url < <(.venv/bin/python - "$AWS_ENDPOINT_URL" <<'EOF'
import sys, time, boto3
kw = dict(endpoint_url=sys.argv[1], region_name="us-east-1")
name = "ll-lambdas-%d" % (time.time() * 1000)
ddb = boto3.client("dynamodb", **kw)
ddb.create_table(
    TableName=name, BillingMode="PAY_PER_REQUEST",
    AttributeDefinitions=[{"AttributeName": n, "AttributeType": t} for n, t in
                          [("connection_id", "S"), ("desired_state", "S"), ("lease_expires_at_ms", "N")]],
    KeySchema=[{"AttributeName": "connection_id", "KeyType": "HASH"}],
    GlobalSecondaryIndexes=[{
        "IndexName": "desired_state-lease_expires_at_ms-index",
        "KeySchema": [{"AttributeName": "desired_state", "KeyType": "HASH"},
                      {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"}}])
ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
print(name, boto3.client("sqs", **kw).create_queue(QueueName=name)["QueueUrl"])
EOF
)
[[ -n "$table" && -n "$queue_url" ]] || fail "could not create the table and queue"
log "table $table, queue $queue_url"

log "cargo lambda watch --only-lambda-apis on $base"
cargo lambda watch --only-lambda-apis --invoke-address 127.0.0.1 --invoke-port "$port" >"$work/watch.log" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 30))
# Any HTTP request to it may be taken as an invocation: wait for the port to accept connections.
until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
  ((SECONDS < deadline)) || { cat "$work/watch.log" >&2; fail "cargo lambda watch did not listen within 30 s"; }
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/watch.log" >&2; fail "cargo lambda watch exited"; }
  sleep 0.1
done

# start_function NAME LOGFILE: runs NAME's bootstrap against the watch server, in JSON log format.
start_function() {
  env AWS_LAMBDA_RUNTIME_API="$base/.rt/$1" AWS_LAMBDA_FUNCTION_NAME="$1" \
    AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128 AWS_LAMBDA_FUNCTION_VERSION=1 AWS_LAMBDA_LOG_FORMAT=JSON \
    LEASELOCK_TABLE="$table" LEASELOCK_QUEUE_URL="$queue_url" LEASELOCK_METRICS_NAMESPACE=leaselock-test \
    "$lambda_dir/$1/bootstrap" >>"$2" 2>&1 &
  pids+=($!)
}

# stop_function: stops the last started bootstrap.
stop_function() {
  local pid="${pids[-1]}"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  unset 'pids[-1]'
}

# invoke NAME EVENT: prints the response; fails the script when the function returns an error.
# Every event invoked is remembered: each file in lambdas/events/ must be.
invoked="$work/invoked"
invoke() {
  echo "$2" >>"$invoked"
  timeout 30 cargo lambda invoke "$1" --invoke-address 127.0.0.1 --invoke-port "$port" \
    --data-file "lambdas/events/$2" --output-format json
}

# check NAME EVENT JQ-EXPRESSION: invokes and asserts the expression holds on the response.
check() {
  local out
  out="$(invoke "$1" "$2")" || fail "$1 $2: invocation failed"
  jq -e "$3" >/dev/null <<<"$out" || fail "$1 $2: expected $3, got $out"
  log "ok  $1 $(printf '%-28s' "$2") $3"
}

# now_ms: wall clock in ms.
now_ms() { date +%s%3N; }

# cold_start NAME EVENT: spawns the bootstrap while its first invocation is being sent, and appends
# the ms from the spawn to the response to $work/cold-NAME. (The watch server holds an invocation
# until the function asks for it, and the function's first poll waits for one, so the order of the
# two does not matter; curl starting alongside costs a few ms at most.)
cold_start() {
  local done_file="$work/cold-$1.done" spawned
  rm -f "$done_file"
  (curl -sf --max-time 30 -o /dev/null -X POST --data-binary "@lambdas/events/$2" \
     "$base/2015-03-31/functions/$1/invocations" && now_ms >"$done_file") &
  local waiter=$!
  spawned="$(now_ms)"
  start_function "$1" "$work/$1-cold.log"
  wait "$waiter" || fail "$1: no response to the cold invocation ($(cat "$work/$1-cold.log"))"
  stop_function
  echo $(($(cat "$done_file") - spawned)) >>"$work/cold-$1"
}

log "router: sample events"
start_function router "$work/router.log"
check router direct-start.json '.desired_state == "STARTED" and .hint_sent == true'
check router direct-start.json '.desired_state == "STARTED" and .fence == 0'
check router direct-stop.json '.desired_state == "STOPPED"'
check router http-get.json '.statusCode == 404'
check router http-start.json '.statusCode == 200 and (.body | fromjson | .desired_state == "STARTED" and .hint_sent)'
check router http-get.json '.statusCode == 200 and (.body | fromjson | .url == "wss://feed.example/stream-1")'
check router http-stop.json '.statusCode == 200 and (.body | fromjson | .desired_state == "STOPPED")'
check router http-start-malformed.json '.statusCode == 400 and (.body | fromjson | .field == "body")'
check router sqs-batch.json '.batchItemFailures == []'
check router sqs-batch-malformed.json '.batchItemFailures == []'
if out="$(invoke router direct-malformed.json 2>&1)"; then
  fail "router direct-malformed.json: expected an error, got $out"
fi
grep -q "non-retryable" <<<"$out" && grep -q "connection_id" <<<"$out" ||
  fail "router direct-malformed.json: the error must name connection_id and say non-retryable: $out"
log "ok  router $(printf '%-28s' direct-malformed.json) error names connection_id, non-retryable"
stop_function

log "reconciler: schedule event"
start_function reconciler "$work/reconciler.log"
# Left running: stream-2 (from the SQS batch), never claimed. Stopped: stream-1, stream-3, stream-5.
check reconciler schedule.json '.orphans == 1 and .hints_sent == 1 and .started == 1 and .stopped == 3 and .complete'
stop_function
emf="$(grep '"_aws"' "$work/reconciler.log" | head -1)"
jq -e '._aws.CloudWatchMetrics[0].Namespace == "leaselock-test" and .Service == "reconciler"
       and .Orphans == 1 and .HintsSent == 1 and .Started == 1 and .Stopped == 3 and .Incomplete == 0' >/dev/null <<<"$emf" ||
  fail "reconciler: no EMF line with the expected metrics in its output: $(cat "$work/reconciler.log")"
log "ok  reconciler EMF line                  $emf"
for f in router reconciler; do
  while IFS= read -r line; do
    jq -e . >/dev/null 2>&1 <<<"$line" || fail "$f: a log line is not JSON with AWS_LAMBDA_LOG_FORMAT=JSON: $line"
  done <"$work/$f.log"
done
log "ok  every log line is JSON"
for event in lambdas/events/*.json; do
  grep -qx "$(basename "$event")" "$invoked" || fail "$event is never invoked here: give it a check"
done
log "ok  every sample event in lambdas/events/ was invoked and checked"

# --- 4. cold starts ------------------------------------------------------------------------------
log "cold starts ($COLD_RUNS runs each)"
results="$root/bench-results/cold-start.txt"
mkdir -p "$(dirname "$results")"
{
  echo "cold start: bootstrap process start -> first response, ms (x86_64 release, local engine, 2 shared cores)"
  for spec in "router direct-start.json" "reconciler schedule.json"; do
    read -r name event <<<"$spec"
    for _ in $(seq 1 "$COLD_RUNS"); do cold_start "$name" "$event"; done
    median="$(sort -n "$work/cold-$name" | sed -n "$(((COLD_RUNS + 1) / 2))p")"
    echo "$name ($event): median ${median} ms; runs: $(tr '\n' ' ' <"$work/cold-$name")"
  done
} >"$results"
cat "$results"
log "all checks passed"
