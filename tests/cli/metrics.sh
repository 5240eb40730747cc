#!/usr/bin/env bash
# Metrics end to end with a real Prometheus: `ect push-consumer` and
# `ect pull-producer` serve /metrics (--metrics-port 0, the port read from
# their ready lines); a Prometheus started here on loopback scrapes both every
# second; items are pushed and pulled; Prometheus's HTTP API must then report
# ectransfer_bytes_total equal to the bytes moved (the consumer's printed
# nbytes, the producer's items pulled) and the pool gauges back to their
# resting values. The endpoint itself: 404 for another path, 400 for a bad
# request, 405 for POST. Prometheus is stopped and its data dir removed after.
# Skipped (77) only when no prometheus binary can be found (Debian package
# `prometheus`, installed by scripts/install-deps.sh).
. "$(dirname "$0")/lib.sh"

# the flag itself (no Prometheus needed)
expect_exit 2 "metrics-port" "$ect" push-consumer --host 127.0.0.1 --port 1 --metrics-port 70000
expect_exit 2 "metrics-port" "$ect" pull-producer --metrics-port x
"$ect" push-consumer --help | grep -q -- '--metrics-port P'
"$ect" pull-producer --help | grep -q -- '--metrics-port P'

prom=$(command -v prometheus || true)
if [ -z "$prom" ]; then
  echo "SKIP: no prometheus binary (apt-get install prometheus; scripts/install-deps.sh does)"
  exit 77
fi
py=/usr/bin/python3

# http_status PORT METHOD PATH [RAW]: the status code the endpoint answers
# (RAW: send these bytes verbatim instead of a well-formed request).
http_status() {
  "$py" - "$@" <<'EOF'
import socket, sys
port, method, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
raw = sys.argv[4].encode().decode("unicode_escape").encode("latin-1") if len(sys.argv) > 4 else \
    f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
s = socket.create_connection(("127.0.0.1", port), timeout=30)
s.sendall(raw)
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(data.split(b" ", 2)[1].decode())
EOF
}

# prom_query EXPR: the value of the instant query EXPR ("" when no series;
# the sum when several).
prom_query() {
  "$py" - "$prom_port" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
port, expr = sys.argv[1], sys.argv[2]
u = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
try:
    r = json.load(urllib.request.urlopen(u, timeout=30))
except Exception:
    print("")
    sys.exit(0)
res = r.get("data", {}).get("result", [])
print(sum(float(x["value"][1]) for x in res) if res else "")
EOF
}

# wait_query EXPR WANT [SECONDS]: until EXPR evaluates to WANT (numerically).
wait_query() {
  local i v="" secs=${3:-120}
  for ((i = 0; i < secs * 4; i++)); do
    v=$(prom_query "$1")
    if [ -n "$v" ] && "$py" -c "import sys; sys.exit(0 if float('$v') == float('$2') else 1)"; then
      return 0
    fi
    sleep 0.25
  done
  echo "Prometheus: $1 = '$v', want $2 (after ${secs} s)"
  tail -20 "$tmp/prom.log"
  exit 1
}

# the daemons, each with an ephemeral metrics port
start_consumer "$tmp/cons" 1 --pool-size 16MiB --metrics-port 0
cport=$port
cmetrics=$(event_field "$tmp/cons" ready metrics_port)
[ -n "$cmetrics" ] || { cat "$tmp/cons"; echo "no metrics_port in the ready line"; exit 1; }
"$ect" pull-producer --host 127.0.0.1 --port 0 --pool-size 16MiB --count 3 --size 100KiB \
  --metrics-port 0 >"$tmp/prod" 2>"$tmp/prod.err" &
ppid=$!
pids+=("$ppid")
wait_event "$tmp/prod" ready "$ppid" || { cat "$tmp/prod.err"; echo "producer never served"; exit 1; }
pport=$(event_field "$tmp/prod" ready port)
pmetrics=$(event_field "$tmp/prod" ready metrics_port)

# the endpoint answers the way the header says
[ "$(http_status "$cmetrics" GET /metrics)" = 200 ]
[ "$(http_status "$cmetrics" GET /nothing)" = 404 ]
[ "$(http_status "$cmetrics" POST /metrics)" = 405 ]
[ "$(http_status "$cmetrics" GET /metrics 'GARBAGE\r\n\r\n')" = 400 ]
[ "$(http_status "$cmetrics" GET /metrics 'GET /metrics HTTP/9.9\r\n\r\n')" = 400 ]
# and keeps serving after them
[ "$(http_status "$pmetrics" GET /metrics)" = 200 ]

# Prometheus on loopback, scraping both every second
cat >"$tmp/prom.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: ect
    static_configs:
      - targets: ['127.0.0.1:$cmetrics', '127.0.0.1:$pmetrics']
EOF
started=""
for attempt in 1 2 3 4 5; do
  prom_port=$(free_port 1)
  "$prom" --config.file="$tmp/prom.yml" --storage.tsdb.path="$tmp/promdata" \
    --web.listen-address="127.0.0.1:$prom_port" >"$tmp/prom.log" 2>&1 &
  prom_pid=$!
  pids+=("$prom_pid")
  # ready: the API answers and both targets are up
  for ((i = 0; i < 120 * 4; i++)); do
    kill -0 "$prom_pid" 2>/dev/null || break
    if [ "$(prom_query 'sum(up{job="ect"})')" = "2.0" ]; then started=1; break; fi
    sleep 0.25
  done
  [ -n "$started" ] && break
  grep -q 'address already in use' "$tmp/prom.log" && continue
  tail -30 "$tmp/prom.log"
  echo "Prometheus did not report both targets up"
  exit 1
done
[ -n "$started" ]

# resting values before anything moved
wait_query 'ectransfer_bytes_total{role="push_consumer",direction="in"}' 0
wait_query 'ectransfer_bytes_total{role="pull_producer",direction="out"}' 0
prod_rest=$(prom_query 'ectransfer_pool_used_bytes{role="pull_producer"}')
[ -n "$prod_rest" ]

# move: 5 items of 48 KiB pushed, every item of the producer pulled
timeout 120 "$ect" push --to "127.0.0.1:$cport" --count 5 --size 48KiB >"$tmp/push.out" 2>"$tmp/push.err" ||
  { cat "$tmp/push.err"; echo "ect push failed"; exit 1; }
wait_items "$tmp/cons" 5
timeout 120 "$ect" pull --from "127.0.0.1:$pport" --all --pool-size 8MiB >"$tmp/pull.out" 2>"$tmp/pull.err" ||
  { cat "$tmp/pull.err"; echo "ect pull failed"; exit 1; }

pushed=$(items "$tmp/cons" | "$py" -c 'import json,sys; print(sum(json.loads(l)["nbytes"] for l in sys.stdin))')
pulled=$(items "$tmp/prod" | "$py" -c 'import json,sys; print(sum(json.loads(l)["nbytes"] for l in sys.stdin))')
[ "$pushed" -eq $((5 * 48 * 1024)) ]
[ "$pulled" -eq $((3 * 100 * 1024)) ]

wait_query 'ectransfer_bytes_total{role="push_consumer",direction="in"}' "$pushed"
wait_query 'ectransfer_items_total{role="push_consumer",direction="in"}' 5
wait_query 'ectransfer_bytes_total{role="pull_producer",direction="out"}' "$pulled"
wait_query 'ectransfer_items_total{role="pull_producer",direction="out"}' 3
# pools back at rest: the consumer holds nothing beyond its resident cache and
# no reservation is being written; the producer holds what it held before
wait_query 'ectransfer_pool_used_bytes{role="push_consumer"} - ectransfer_pool_resident_bytes{role="push_consumer"}' 0
wait_query 'ectransfer_reservations{role="push_consumer",state="WRITING"}' 0
wait_query 'ectransfer_pool_used_bytes{role="pull_producer"}' "$prod_rest"
wait_query 'ectransfer_refusals_total{role="push_consumer",reason="full"}' 0
wait_query 'ectransfer_pool_capacity_bytes{role="push_consumer"}' $((16 * 1024 * 1024))

# stop Prometheus and remove its data; then the daemons
kill -TERM "$prom_pid"
wait_exit "$prom_pid" 60
wait "$prom_pid" || true
rm -rf "$tmp/promdata"
stop_consumer "$tmp/cons"
kill -TERM "$ppid"
wait_exit "$ppid" 60
wait "$ppid"
echo "metrics: ok (pushed $pushed bytes, pulled $pulled bytes, seen by Prometheus)"
