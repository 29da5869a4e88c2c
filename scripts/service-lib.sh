# Sourced by scripts/services.sh (moto) and scripts/redis.sh: start a local server in the
# background, wait until it answers, stop only the one started here (by its pid).
# The sourcing script sets NAME, PORT, WHERE and STATE and defines answers() and install().
PIDFILE="$STATE/$NAME-$PORT.pid"
LOG="$STATE/$NAME-$PORT.log"

ours() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# launch SECONDS PAUSE CMD...: unless something already answers, installs, starts CMD and polls
# answers() every PAUSE s for up to SECONDS s; fails at once (with the log) if CMD exits.
launch() {
  local seconds=$1 pause=$2 tries
  shift 2
  if answers; then
    echo "services: $NAME already answering on $WHERE"
    return 0
  fi
  install
  mkdir -p "$STATE"
  echo "services: starting $NAME on $WHERE"
  nohup "$@" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  tries=$(awk -v s="$seconds" -v p="$pause" 'BEGIN { print int(s / p + 0.5) }')
  for _ in $(seq 1 "$tries"); do
    if answers; then
      echo "services: $NAME ready (pid $(cat "$PIDFILE"))"
      return 0
    fi
    ours || { echo "services: $NAME exited; log follows" >&2; cat "$LOG" >&2; return 1; }
    sleep "$pause"
  done
  echo "services: $NAME did not answer on $WHERE within $seconds s" >&2
  return 1
}

stop() {
  if ours; then
    local pid
    pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "services: $NAME stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

status() {
  if answers; then echo "$NAME answering on $WHERE"; else echo "$NAME not running"; return 1; fi
}
