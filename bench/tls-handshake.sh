#!/usr/bin/env bash
# Full TLS handshakes per CPU-second of one Weir worker: a TLS listener with no routes (the
# default 404 answers), `openssl s_time -new -www /` clients (a new connection, full
# handshake, one request each), Weir's CPU time read from /proc before and after, and the
# handshakes counted by weir_tls_handshakes_total. Dividing by CPU time rather than wall
# time keeps the figure meaningful on a busy machine where the clients share the cores.
#
# Usage: bench/tls-handshake.sh [SECONDS] [CLIENTS]   (defaults: 10 and 2)
# Runs TLS 1.3 and TLS 1.2, each with an ECDSA P-256 and an RSA-2048 certificate.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${1:-10}
CLIENTS=${2:-2}
cargo build --release -q -p weir
WEIR=$PWD/target/release/weir
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
handshakes() {
    curl -s "127.0.0.1:$ADMIN/metrics" |
        awk '/^weir_tls_handshakes_total/ && /result="(full|resumed)"/ {n += $2} END {print n + 0}'
}

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=bench.local \
    -addext subjectAltName=DNS:bench.local -keyout "$DIR/ecdsa.key" -out "$DIR/ecdsa.pem" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=bench.local \
    -addext subjectAltName=DNS:bench.local -keyout "$DIR/rsa.key" -out "$DIR/rsa.pem" 2>/dev/null

HZ=$(getconf CLK_TCK)
printf '%-8s %-6s %10s %12s %14s\n' version key handshakes cpu_seconds per_cpu_second
for key in ecdsa rsa; do
    PORT=$(free_port)
    ADMIN=$(free_port)
    cat > "$DIR/weir.toml" <<TOML
[server]
workers = 1
[admin]
bind = "127.0.0.1:$ADMIN"
[[listeners]]
name = "tls"
bind = "127.0.0.1:$PORT"
[listeners.tls]
certs = [{ cert = "$DIR/$key.pem", key = "$DIR/$key.key" }]
TOML
    WEIR_LOG=warn "$WEIR" run -c "$DIR/weir.toml" &
    PID=$!
    until curl -s "127.0.0.1:$ADMIN/live" >/dev/null; do sleep 0.1; done
    for version in tls1_3 tls1_2; do
        before_cpu=$(cpu_ticks $PID)
        before_n=$(handshakes)
        for _ in $(seq "$CLIENTS"); do
            openssl s_time -connect "127.0.0.1:$PORT" -new -"$version" -www / -time "$SECS" >/dev/null 2>&1 &
        done
        wait $(jobs -p | grep -v "^$PID$")
        cpu=$(( $(cpu_ticks $PID) - before_cpu ))
        n=$(( $(handshakes) - before_n ))
        awk -v v="$version" -v k="$key" -v n="$n" -v t="$cpu" -v hz="$HZ" \
            'BEGIN {printf "%-8s %-6s %10d %12.2f %14.0f\n", v, k, n, t / hz, n / (t / hz)}'
    done
    kill $PID
    wait $PID 2>/dev/null || true
done
