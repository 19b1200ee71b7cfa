#!/bin/bash
# 20 binary upgrades and 100 admin API changes under a steady wrk load; prints wrk's
# summary (a "Socket errors" or "Non-2xx" line would mean failed requests).
# Usage: bench/upgrade-under-load.sh [path/to/weir]   (default: target/debug/weir)
set -euo pipefail
W=$(realpath "${1:-target/debug/weir}")
export NO_COLOR=1
DIR=$(mktemp -d)
cd "$DIR"
cat > weir.toml <<'TOML'
[server]
workers = 2
drain_timeout = "5s"

[admin]
bind = "127.0.0.1:19901"

[[listeners]]
name = "web"
bind = "127.0.0.1:18081"

[[listeners.routes]]
name = "all"
upstream = "app"

[upstreams.app]
lb = "weighted_round_robin"
servers = [{ addr = "127.0.0.1:18080" }]
TOML
# The backend: weir's own demo (three echo servers behind a weir on 18080).
"$W" demo --port 18080 --admin-port 18099 > demo.log 2>&1 &
DEMO=$!
"$W" run -c weir.toml > weir.log 2>&1 &
PID=$!
# Whatever happens, stop what this script started (by pid).
trap 'kill "${WRK:-}" "$PID" "$DEMO" 2>/dev/null || true' EXIT
sleep 1
wrk -t2 -c16 -d45s http://127.0.0.1:18081/ > wrk.txt 2>&1 &
WRK=$!
sleep 2
changes=0
for round in $(seq 1 20); do
  for i in 1 2 3 4 5; do
    w=$(( (round + i) % 4 + 1 ))
    code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X PUT -H 'Content-Type: application/json' -d "{\"weight\": $w}" \
      http://127.0.0.1:19901/api/v1/upstreams/app/servers/127.0.0.1:18080)
    if [ "$code" = 200 ]; then changes=$((changes + 1)); else echo "API change failed: $code"; fi
  done
  "$W" upgrade --pid "$PID"
  NEW=""
  for _ in $(seq 1 400); do
    NEW=$(grep -o 'new_pid=[0-9]*' weir.log | sed -n "${round}p" | cut -d= -f2 || true)
    [ -n "$NEW" ] && break
    sleep 0.05
  done
  [ -n "$NEW" ] || { echo "upgrade $round did not complete"; break; }
  # The old process drains and exits (an orphan may linger as a zombie until reaped).
  while kill -0 "$PID" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" != Z ]; do
    sleep 0.05
  done
  PID=$NEW
  sleep 1
done
echo "API changes: $changes, upgrades: $(grep -c 'new process is ready' weir.log)"
wait "$WRK"
cat wrk.txt
