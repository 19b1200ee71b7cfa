#!/usr/bin/env bash
# Memory per idle connection, Weir vs nginx (and HAProxy when installed): each proxy alone
# on CPU 0, one worker, a local 404 answer; a Python client opens N connections (TLS 1.3 with
# an ECDSA P-256 certificate, or plain TCP), sends one request on each and reads its answer,
# then keeps them all open and idle. The figure is the growth of the proxy's RSS (every
# process of its group, from /proc) divided by N. Kernel socket memory is not in RSS.
#
# Usage: bench/tls-idle.sh [N] [WEIR]   (defaults: 10000 and target/release/weir)
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-10000}
WEIR=${2:-$PWD/target/release/weir}
ulimit -n "$(ulimit -Hn)"   # N client fds + N proxy fds, each process under the limit
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -- -"$p" 2>/dev/null || true; done; rm -rf "$DIR"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# RSS in KiB of every process in the group of $1.
group_rss() { ps -o rss= -g "$1" | awk '{n += $1} END {print n + 0}'; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost -keyout "$DIR/key.pem" -out "$DIR/cert.pem" 2>/dev/null
cat "$DIR/cert.pem" "$DIR/key.pem" > "$DIR/haproxy.pem"

cat > "$DIR/client.py" <<'PY'
import socket, ssl, sys, time
port, n, tls, cafile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "tls", sys.argv[4]
ctx = ssl.create_default_context(cafile=cafile)
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
conns = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    if tls:
        s = ctx.wrap_socket(s, server_hostname="localhost")
    s.sendall(b"GET /idle HTTP/1.1\r\nHost: localhost\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or not got.endswith(b"no route"):
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("connection closed early")
        got += chunk
    conns.append(s)
print("open", flush=True)
sys.stdin.read()   # hold the connections until told to stop
PY

weir_conf() { # port tls
    cat <<TOML
[server]
workers = 1
[admin]
bind = "off"
[[listeners]]
name = "idle"
bind = "127.0.0.1:$1"
backlog = 4096
max_connections = 100000
keepalive_timeout = "300s"
default_response = { status = 404, body = "no route", content_type = "text/plain" }
TOML
    [ "$2" = tls ] && printf '[listeners.tls]\ncerts = [{ cert = "%s", key = "%s" }]\n' "$DIR/cert.pem" "$DIR/key.pem"
    true
}
nginx_conf() { # port tls
    local ssl="" certs=""
    if [ "$2" = tls ]; then
        ssl=" ssl"
        certs="ssl_certificate $DIR/cert.pem; ssl_certificate_key $DIR/key.pem; ssl_protocols TLSv1.2 TLSv1.3;"
    fi
    cat <<NGINX
worker_processes 1; daemon off; master_process on; pid $DIR/nginx-$1.pid;
error_log $DIR/nginx.error.log error; worker_rlimit_nofile 20000;
events { worker_connections 19000; }
http { access_log off; keepalive_timeout 300s; keepalive_requests 1000000;
  server { listen 127.0.0.1:$1$ssl backlog=4096; $certs
    location / { return 404 "no route"; } } }
NGINX
}
haproxy_conf() { # port tls
    local ssl=""
    [ "$2" = tls ] && ssl=" ssl crt $DIR/haproxy.pem alpn http/1.1"
    cat <<HAP
global
    nbthread 1
    maxconn $((N + 50))
defaults
    mode http
    timeout client 300s
    timeout http-keep-alive 300s
    option http-keep-alive
listen idle
    bind 127.0.0.1:$1$ssl
    http-request return status 404 content-type text/plain string "no route"
HAP
}

printf '%-8s %-6s %8s %14s %16s\n' proxy conn count rss_delta_kib per_conn_bytes
for mode in plain tls; do
    for proxy in weir nginx haproxy; do
        command -v "$proxy" >/dev/null || [ "$proxy" = weir ] || continue
        if [ $proxy = haproxy ] && [ $((2 * N + 300)) -gt "$(ulimit -n)" ]; then
            echo "haproxy  $mode   skipped: it reserves 2 fds per connection, over the fd limit $(ulimit -n)"
            continue
        fi
        PORT=$(free_port)
        case $proxy in
            weir) weir_conf "$PORT" $mode > "$DIR/weir.toml"
                  cmd=("$WEIR" run -c "$DIR/weir.toml") ;;
            nginx) nginx_conf "$PORT" $mode > "$DIR/nginx.conf"
                   cmd=(nginx -p "$DIR" -e "$DIR/nginx.error.log" -c "$DIR/nginx.conf") ;;
            haproxy) haproxy_conf "$PORT" $mode > "$DIR/haproxy.cfg"
                     cmd=(haproxy -db -f "$DIR/haproxy.cfg") ;;
        esac
        WEIR_LOG=warn setsid taskset -c 0 "${cmd[@]}" > "$DIR/$proxy.log" 2>&1 &
        PID=$!
        PIDS+=("$PID")
        until python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT))" 2>/dev/null; do
            kill -0 "$PID" 2>/dev/null || { echo "$proxy did not start:"; cat "$DIR/$proxy.log"; exit 1; }
            sleep 0.1
        done
        # One connection first, so lazily made state (TLS contexts, pools) is not counted.
        echo | taskset -c 1 python3 "$DIR/client.py" "$PORT" 1 $mode "$DIR/cert.pem" > /dev/null
        sleep 1
        before=$(group_rss "$PID")
        coproc CLIENT { taskset -c 1 python3 "$DIR/client.py" "$PORT" "$N" $mode "$DIR/cert.pem"; }
        read -r _ <&"${CLIENT[0]}"
        sleep 2
        after=$(group_rss "$PID")
        exec {CLIENT[1]}>&-
        wait "$CLIENT_PID" 2>/dev/null || true
        awk -v p=$proxy -v m=$mode -v n="$N" -v b="$before" -v a="$after" \
            'BEGIN {printf "%-8s %-6s %8d %14d %16.0f\n", p, m, n, a - b, (a - b) * 1024 / n}'
        kill -- -"$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    done
done
