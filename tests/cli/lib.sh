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
# daemon that then finds one taken says "address in use": try again), below
# the kernel's ephemeral range, so no connection's source port takes it
# between this check and the daemon's bind.
free_port() {
  python3 - "${1:-1}" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
lo = max(lo, 20000 + 2 * n)
for _ in range(200):
    base = random.randint(20000, lo - n)
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

# netns_pair TAG1 TAG2 [v6]: two "hosts" on this machine for the multi-host
# tests: network namespaces $ns1 (ect-TAG1-PID-RANDOM) and $ns2 (ect-TAG2-...)
# joined by a veth pair, $veth1 in ns1 with 192.0.2.1/24 and $veth2 in ns2
# with 192.0.2.2/24, loopback and veth up; in1 / in2 run a command in ns1 /
# ns2. With v6 also 2001:db8::1/64 and 2001:db8::2/64 (nodad); $have_v6 is 0
# where the kernel refused them. Replaces the EXIT trap with netns_cleanup:
# kills every process in $pids, removes both namespaces and the veth, then
# lib_cleanup. Exits 77 (skipped) with a message where a namespace cannot be
# made (needs root and ip netns). Call it from the script's top level.
netns_pair() {
  ns1=ect-$1-$$-$RANDOM
  ns2=ect-$2-$$-$RANDOM
  veth1=ect$1$$
  veth2=ect$2$$
  veth1=${veth1:0:15}
  veth2=${veth2:0:15}
  trap netns_cleanup EXIT
  if ! ip netns add "$ns1" 2>"$tmp/netns.err"; then
    echo "SKIP: cannot create a network namespace (needs root and ip netns): $(cat "$tmp/netns.err")"
    exit 77
  fi
  ip netns add "$ns2"
  ip link add "$veth1" type veth peer name "$veth2"
  ip link set "$veth1" netns "$ns1"
  ip link set "$veth2" netns "$ns2"
  in1 ip link set lo up
  in2 ip link set lo up
  in1 ip addr add 192.0.2.1/24 dev "$veth1"
  in2 ip addr add 192.0.2.2/24 dev "$veth2"
  have_v6=0
  if [ "${3:-}" = v6 ]; then
    have_v6=1
    in1 ip -6 addr add 2001:db8::1/64 dev "$veth1" nodad 2>/dev/null || have_v6=0
    in2 ip -6 addr add 2001:db8::2/64 dev "$veth2" nodad 2>/dev/null || have_v6=0
  fi
  in1 ip link set "$veth1" up
  in2 ip link set "$veth2" up
}
in1() { ip netns exec "$ns1" "$@"; }
in2() { ip netns exec "$ns2" "$@"; }
netns_cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  ip link del "$veth1" 2>/dev/null || true
  lib_cleanup
}
