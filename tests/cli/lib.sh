# lib.sh — what the CLI script tests share. Source it first:
#   . "$(dirname "$0")/lib.sh"
# It sets `set -euo pipefail`, $ect (the binary under test), $tmp (a scratch
# folder, removed on exit unless KEEP is set) and an EXIT trap that kills
# every process listed in $pids and $burners. Every wait polls state (a
# line in a file, a process) under a generous bound; none is a bare sleep.
# The daemons say they are ready with a JSON line on stdout,
# {"event": "ready", ...}; the tests wait for that line, not for log text.
set -euo pipefail
ect=${ECT_BIN:?}
tmp=$(mktemp -d)
pids=()
burners=()
lib_cleanup() {
  local p
  for p in "${pids[@]}" "${burners[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap lib_cleanup EXIT

# free_port N: a base port B with B .. B+N-1 free on 127.0.0.1 right now (a
# daemon that then finds one taken says "address in use": try again).
free_port() {
  python3 - "${1:-1}" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 60000 - n)
    socks = []
    try:
        for i in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", base + i))
            socks.append(s)
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
EOF
}

# has_event FILE EVENT: FILE has a JSON line whose "event" is EVENT.
has_event() { grep -Eq "^\\{\"event\": ?\"$2\"" "$1" 2>/dev/null; }

# event_field FILE EVENT KEY: KEY's value in FILE's EVENT line (a list as
# space-separated words).
event_field() {
  python3 - "$@" <<'EOF'
import json, sys
path, event, key = sys.argv[1:4]
for line in open(path):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if isinstance(o, dict) and o.get("event") == event:
        v = o[key]
        print(" ".join(map(str, v)) if isinstance(v, list) else v)
        break
EOF
}

# wait_event FILE EVENT PID [SECONDS]: until FILE has the EVENT line (0), or
# PID exited, or SECONDS (default 60) passed (1).
wait_event() {
  local i secs=${4:-60}
  for ((i = 0; i < secs * 20; i++)); do
    has_event "$1" "$2" && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.05
  done
  has_event "$1" "$2"
}

# wait_exit PID SECONDS: fails when PID still runs after SECONDS.
wait_exit() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  echo "process $1 still running after $2 s"
  exit 1
}

# start_consumer OUT TP ARGS...: `ect push-consumer` with TP shards on a free
# port range (another one when it was taken meanwhile), stdout to OUT, stderr
# to OUT.err; returns once it printed its ready event (every shard listens
# and its scheduler reached every one). Sets $port and $cpid.
start_consumer() {
  local out=$1 tp=$2 attempt
  shift 2
  for attempt in 1 2 3 4 5 6 7 8; do
    port=$(free_port "$tp")
    # an earlier run's ready line must not pass for this one's: the
    # background redirect truncates OUT only once the child runs
    rm -f "$out" "$out.err"
    "$ect" push-consumer --host 127.0.0.1 --port "$port" --tp "$tp" "$@" >"$out" 2>"$out.err" &
    cpid=$!
    pids+=("$cpid")
    wait_event "$out" ready "$cpid" && return 0
    grep -q 'address in use' "$out.err" && continue
    cat "$out.err"
    echo "push-consumer did not start (attempt $attempt)"
    exit 1
  done
  echo "no free port range"
  exit 1
}

# stop_consumer OUT [SIGNAL]: SIGTERM (or SIGNAL) to $cpid, which must exit 0
# within 60 s with 0 live reservations and 0 bytes in use on every rank.
stop_consumer() {
  kill -"${2:-TERM}" "$cpid"
  wait_exit "$cpid" 60
  wait "$cpid" || { cat "$1.err"; echo "consumer exited non-zero"; exit 1; }
  if grep 'live reservations' "$1.err" | grep -v ': 0 live reservations, 0 bytes in use'; then
    echo "consumer left reservations or memory behind"
    exit 1
  fi
}

# items FILE: a daemon's output without its event lines (one line per item).
items() { grep -v '^{"event"' "$1" 2>/dev/null || true; }
count_items() { items "$1" | wc -l; }

# wait_items FILE N [SECONDS]: until FILE has N item lines (default 60 s).
wait_items() {
  local i secs=${3:-60}
  for ((i = 0; i < secs * 20; i++)); do
    [ "$(count_items "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "only $(count_items "$1") of $2 items arrived in $1"
  exit 1
}

# wait_grep PATTERN FILE [SECONDS]: until FILE has a line matching PATTERN.
wait_grep() {
  local i secs=${3:-60}
  for ((i = 0; i < secs * 20; i++)); do
    grep -q -- "$1" "$2" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$2"
  echo "no '$1' in $2"
  exit 1
}

# expect_exit RC TEXT CMD...: CMD exits with RC and says TEXT on stderr.
expect_exit() {
  local want=$1 text=$2 rc=0
  shift 2
  "$@" >"$tmp/expect.out" 2>"$tmp/expect.err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/expect.err"; echo "$*: exit $rc, want $want"; exit 1; }
  grep -q -- "$text" "$tmp/expect.err" ||
    { cat "$tmp/expect.err"; echo "$*: stderr lacks '$text'"; exit 1; }
}

# start_burners N: N processes that each burn a core until the test ends.
start_burners() {
  local i
  for ((i = 0; i < $1; i++)); do
    sh -c 'while :; do :; done' &
    burners+=("$!")
    disown "$!" # killed on exit; no job-control notice
  done
}
