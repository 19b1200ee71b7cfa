#!/usr/bin/env bash
# Seed 002 under load: a listener with no routes (every answer is the default 404) and its
# admin /metrics, driven by ab as in the seed report.
#
#   1. exact:  ab -n N -c 100 GET and the same with POST, at the same time; every response
#              must be a 404 and weir_requests_total must grow by exactly 2 x N.
#   2. fd cap: Weir started with `ulimit -n` far below what ab -c 10000 needs; Weir must stay
#              up, count EMFILE in weir_accept_errors_total, keep serving, and answer normally
#              (with no connection left open) once the load stops. Run twice: with the
#              listener's default `defer_accept = true` (connections reach Weir with their
#              request and are answered at once, so the cap may never be reached), then with
#              `defer_accept = false`, which accepts at connect time as the seed's server did
#              and must run out of descriptors.
#
# Usage: bench/seed002.sh [N] [FD_LIMIT]   (defaults: 1000000 and 1024)
# Needs ab (bench/setup.sh) and builds Weir in release mode. Weir runs one worker on CPU 0;
# the ab processes run on CPU 1. Prints a short report; exits non-zero if a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-1000000}
FD_LIMIT=${2:-1024}
cargo build --release -q -p weir
WEIR=$PWD/target/release/weir
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
ADMIN=$(free_port)
URL=http://127.0.0.1:$PORT/page.html
cat >"$DIR/weir.toml" <<EOF
[server]
workers = 1
drain_timeout = "0s"

[admin]
bind = "127.0.0.1:$ADMIN"

[[listeners]]
name = "default"
bind = "127.0.0.1:$PORT"
backlog = 4096
max_connections = 100000
default_response = { status = 404, body = "default backend - 404\n" }
EOF
sed 's/^max_connections = 100000$/max_connections = 100000\ndefer_accept = false/' \
  "$DIR/weir.toml" >"$DIR/weir-nodefer.toml"
echo "hola" >"$DIR/post.txt"

metric() { # metric NAME_AND_LABEL_PREFIX: sum of every series starting with it
  curl -s "http://127.0.0.1:$ADMIN/metrics" | awk -v p="$1" 'index($0, p) == 1 { s += $NF } END { printf "%d\n", s }'
}
start_weir() { # start_weir FD_LIMIT [CONFIG]
  (ulimit -n "$1"; exec taskset -c 0 "$WEIR" run -c "${2:-$DIR/weir.toml}") >"$DIR/weir.log" 2>&1 &
  WEIR_PID=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$ADMIN/ready" >/dev/null && return 0
    sleep 0.1
  done
  echo "weir did not become ready"; cat "$DIR/weir.log"; exit 1
}
stop_weir() { kill -TERM "$WEIR_PID"; wait "$WEIR_PID" || true; }
ab_field() { awk -F: -v f="$1" '$1 == f { gsub(/[^0-9.]/, "", $2); print $2 }' "$2"; }
fail=0
check() { if [ "$1" = "$2" ]; then echo "  ok   $3: $1"; else echo "  FAIL $3: $1, want $2"; fail=1; fi; }

echo "== 1. ab -n $N -c 100, GET and POST at the same time"
start_weir "$(ulimit -Hn)"
before=$(metric 'weir_requests_total{')
cpu0=$(awk '{print $14 + $15}' "/proc/$WEIR_PID/stat")
t0=$(date +%s.%N)
taskset -c 1 ab -q -n "$N" -c 100 "$URL" >"$DIR/get.log" 2>&1 &
G=$!
taskset -c 1 ab -q -n "$N" -c 100 -p "$DIR/post.txt" -T text/plain "$URL" >"$DIR/post.log" 2>&1 &
P=$!
wait $G $P
t1=$(date +%s.%N)
cpu1=$(awk '{print $14 + $15}' "/proc/$WEIR_PID/stat")
after=$(metric 'weir_requests_total{')
for kind in get post; do
  log="$DIR/$kind.log"
  echo "  $kind: $(ab_field 'Complete requests' "$log") complete, $(ab_field 'Failed requests' "$log") failed, $(ab_field 'Non-2xx responses' "$log") non-2xx, $(ab_field 'Requests per second' "$log") req/s"
  check "$(ab_field 'Complete requests' "$log")" "$N" "$kind complete"
  check "$(ab_field 'Non-2xx responses' "$log")" "$N" "$kind all 404"
done
check $((after - before)) $((2 * N)) "weir_requests_total grew by"
check "$(metric 'weir_requests_total{listener="default",route="default",method="POST",code="404",')" "$N" "POST 404 series"
ticks=$(getconf CLK_TCK)
awk -v n=$((2 * N)) -v c=$((cpu1 - cpu0)) -v t="$ticks" -v s="$t0" -v e="$t1" \
  'BEGIN { printf "  combined %.0f req/s over %.1f s; Weir CPU %.2f us/request\n", n / (e - s), e - s, c / t / n * 1e6 }'
stop_weir

flood() { # flood CONFIG MUST_HIT_EMFILE
  start_weir "$FD_LIMIT" "$1"
  (ulimit -n "$(ulimit -Hn)"; taskset -c 1 ab -q -r -n 200000 -c 10000 "$URL" >"$DIR/flood.log" 2>&1) || true
  echo "  ab: $(ab_field 'Complete requests' "$DIR/flood.log") complete, $(ab_field 'Failed requests' "$DIR/flood.log") failed"
  kill -0 "$WEIR_PID" && echo "  ok   weir still running" || { echo "  FAIL weir exited"; fail=1; }
  emfile=$(metric 'weir_accept_errors_total{listener="default",kind="EMFILE"}')
  echo "  weir_accept_errors_total{kind=EMFILE} = $emfile"
  if [ "$2" = yes ] && [ "$emfile" -eq 0 ]; then
    echo "  FAIL no EMFILE counted (raise the load or lower the limit)"; fail=1
  fi
  echo "  $(grep -c "accept" "$DIR/weir.log" || true) accept-error log lines (rate-limited)"
  for _ in $(seq 100); do
    [ "$(metric 'weir_connections_active{')" = 0 ] && break
    sleep 0.1
  done
  check "$(metric 'weir_connections_active{')" 0 "connections open after the load"
  check "$(curl -s -o /dev/null -w '%{http_code}' "$URL")" 404 "a request after the load"
  served=$(metric 'weir_requests_total{')
  echo "  requests counted: $served (ab completed $(ab_field 'Complete requests' "$DIR/flood.log"))"
  stop_weir
}
echo "== 2a. ab -c 10000 against Weir with ulimit -n $FD_LIMIT (defer_accept = true, the default)"
flood "$DIR/weir.toml" no
echo "== 2b. the same with defer_accept = false (accept at connect, as the seed's server)"
flood "$DIR/weir-nodefer.toml" yes
exit $fail
