# Sourced by scripts/services.sh (moto) and scripts/redis.sh: start a local server in the
# background, wait until it answers, stop only the one started here (by its pid).
# The sourcing script sets NAME, PORT, WHERE and STATE and defines answers(), install() and start().
PIDFILE="$STATE/$NAME-$PORT.pid"
LOG="$STATE/$NAME-$PORT.log"
# Wrappers (scripts/with-services.sh) running at the same time share one server: each is listed
# here by its pid while it runs, and SHARED marks a server one of them started.
USERS="$STATE/$NAME-$PORT.users"
SHARED="$STATE/$NAME-$PORT.shared"
LOCK="$STATE/$NAME-$PORT.lock"

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
  # The server must not inherit the lock of acquire/release (fd 9).
  nohup "$@" >"$LOG" 2>&1 9>&- &
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

# acquire USER: under the service's lock, starts the server unless something answers (then it is
# shared: the last user to release it stops it) and lists USER (a live pid) as a user.
acquire() {
  mkdir -p "$USERS"
  exec 9>"$LOCK"
  flock 9
  if ! answers; then
    start
    touch "$SHARED"
  fi
  touch "$USERS/$1"
  exec 9>&-
}

# release USER: under the service's lock, unlists USER (and users that have exited); the last
# user of a server a wrapper started stops it. A server found running (`make services`) stays.
release() {
  mkdir -p "$USERS"
  exec 9>"$LOCK"
  flock 9
  rm -f "$USERS/$1"
  local user
  for user in "$USERS"/*; do
    [[ -e $user ]] || continue
    kill -0 "${user##*/}" 2>/dev/null || rm -f "$user"
  done
  if [[ -f $SHARED && -z $(ls -A "$USERS") ]]; then
    stop
    rm -f "$SHARED"
  fi
  exec 9>&-
}
