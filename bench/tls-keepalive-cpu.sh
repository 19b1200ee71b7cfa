#!/usr/bin/env bash
# Where a keep-alive TLS request's CPU goes, Weir vs nginx (the `tls-proxy` c=32 row, by hand):
# each proxy on CPU 0, one worker, TLS 1.3 with an ECDSA P-256 certificate, one route to a
# 615-byte nginx backend over HTTP/1.1 keep-alive; wrk -t1 and the backend on CPU 1. For each
# number of connections, each proxy in turn gets a warm-up and a measured wrk run; printed
# per request: the worker thread's user and system CPU (utime, stime from /proc), how often
# it went to sleep (voluntary context switches: blocking epoll_waits), and its CPU share.
# With STRACE=1, one more run per proxy counts system calls per request by kind
# (`strace -c`, which slows the proxy: read the counts, not the times).
#
# Usage: bench/tls-keepalive-cpu.sh [CONNS...] (default: 1 8 32 96)
#   WEIR=path (default target/release/weir), SECS=measured seconds (default 4), STRACE=1
set -euo pipefail
cd "$(dirname "$0")/.."

CONNS=("${@:-1 8 32 96}")
read -r -a CONNS <<< "${CONNS[*]}"
WEIR=${WEIR:-$PWD/target/release/weir}
SECS=${SECS:-4}
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.5; rm -rf "$DIR"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BACKEND=$(free_port); WEIR_PORT=$(free_port); NGINX_PORT=$(free_port)

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost -keyout "$DIR/key.pem" -out "$DIR/cert.pem" 2>/dev/null
BODY=$(head -c 615 /dev/zero | tr '\0' x)

cat > "$DIR/backend.conf" <<EOF
worker_processes 1; daemon off; master_process off; pid $DIR/backend.pid;
error_log $DIR/backend.err error;
events { worker_connections 4096; }
http { access_log off; keepalive_timeout 300s; keepalive_requests 1000000;
  client_body_temp_path $DIR/b-body;
  server { listen 127.0.0.1:$BACKEND backlog=4096; location / { return 200 "$BODY"; } } }
EOF
# As weir-bench's nginx peer: one worker, keep-alive without a request cap on both sides.
cat > "$DIR/proxy.conf" <<EOF
worker_processes 1; daemon off; master_process off; pid $DIR/proxy.pid;
error_log $DIR/proxy.err error; worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http { access_log off; keepalive_timeout 300s; keepalive_requests 1000000;
  client_body_temp_path $DIR/p-body; proxy_temp_path $DIR/p-proxy;
  proxy_http_version 1.1; proxy_set_header Connection "";
  upstream backend { server 127.0.0.1:$BACKEND; keepalive 1024; keepalive_requests 1000000; keepalive_timeout 300s; }
  server { listen 127.0.0.1:$NGINX_PORT ssl backlog=4096;
    ssl_certificate $DIR/cert.pem; ssl_certificate_key $DIR/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;
    location / { proxy_pass http://backend; } } }
EOF
# As weir-bench's Weir peer (bench/templates/weir.toml with the tls-proxy listener).
cat > "$DIR/weir.toml" <<EOF
[server]
workers = 1
drain_timeout = "0s"
[admin]
bind = "off"
[[listeners]]
name = "bench"
bind = "127.0.0.1:$WEIR_PORT"
backlog = 4096
max_connections = 100000
keepalive_timeout = "300s"
keepalive_requests = 0
[listeners.tls]
certs = [{ cert = "$DIR/cert.pem", key = "$DIR/key.pem" }]
[[listeners.routes]]
name = "all"
path_prefix = "/"
forwarded_headers = false
upstream = "backend"
[upstreams.backend]
servers = [{ addr = "127.0.0.1:$BACKEND" }]
max_idle = 1024
idle_timeout = "300s"
EOF

taskset -c 1 nginx -c "$DIR/backend.conf" & PIDS+=($!)
taskset -c 0 nginx -c "$DIR/proxy.conf" & PIDS+=($!)
taskset -c 0 "$WEIR" run --config "$DIR/weir.toml" > "$DIR/weir.log" 2>&1 & PIDS+=($!)
WEIR_PID=$!
NGINX_PID=${PIDS[1]}
for port in "$WEIR_PORT" "$NGINX_PORT"; do
    for _ in $(seq 50); do curl -sk -o /dev/null "https://127.0.0.1:$port/" && break; sleep 0.2; done
done
WEIR_TID=$(ps -T -p "$WEIR_PID" -o tid=,comm= | awk '/weir-worker/ {print $1}')

# wrk against $1 with $2 connections for $3 seconds; prints the request count.
load() { taskset -c 1 wrk -t1 -c"$2" -d"$3"s "https://127.0.0.1:$1/" | awk '/requests in/ {print $1}'; }
# user ticks, system ticks, voluntary context switches of thread $2 of process $1.
sample() {
    echo "$(awk '{print $14, $15}' "/proc/$1/task/$2/stat") $(awk '/^voluntary/ {print $2}' "/proc/$1/task/$2/status")"
}

measure() { # name port pid tid conns
    load "$2" "$5" 1 > /dev/null
    read -r u0 s0 v0 < <(sample "$3" "$4")
    local reqs; reqs=$(load "$2" "$5" "$SECS")
    read -r u1 s1 v1 < <(sample "$3" "$4")
    awk -v n="$1" -v c="$5" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v v=$((v1 - v0)) -v r="$reqs" \
        -v t="$(getconf CLK_TCK)" -v secs="$SECS" 'BEGIN {
        printf "| %s | %d | %.0f | %.2f | %.2f | %.2f | %.3f | %.0f%% |\n", n, c, r / secs,
            u / t * 1e6 / r, s / t * 1e6 / r, (u + s) / t * 1e6 / r, v / r, (u + s) / t / secs * 100 }'
}

echo "| proxy | conns | req/s | user us/req | sys us/req | CPU us/req | sleeps/req | CPU |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for c in "${CONNS[@]}"; do
    measure weir "$WEIR_PORT" "$WEIR_PID" "$WEIR_TID" "$c"
    measure nginx "$NGINX_PORT" "$NGINX_PID" "$NGINX_PID" "$c"
done

[ "${STRACE:-0}" = 1 ] || exit 0
count_syscalls() { # name port tid
    load "$2" 32 1 > /dev/null
    strace -c -p "$3" -o "$DIR/strace-$1" 2> /dev/null & local st=$!
    sleep 0.5
    local reqs; reqs=$(load "$2" 32 3)
    sleep 0.3; kill -INT "$st"; wait "$st" || true
    echo "$1 (c=32, $reqs requests): calls/req (errors/req)"
    awk -v r="$reqs" '$1 ~ /^[0-9.]+$/ && NF >= 5 {
        errs = ($5 ~ /^[0-9]+$/) ? $5 : 0
        printf "  %-12s %.3f (%.3f)\n", $NF, $4 / r, errs / r }' "$DIR/strace-$1"
}
count_syscalls weir "$WEIR_PORT" "$WEIR_TID"
count_syscalls nginx "$NGINX_PORT" "$NGINX_PID"
