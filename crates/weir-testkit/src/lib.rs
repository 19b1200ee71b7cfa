//! Test backends and clients for Weir's integration tests and `weir demo`.
//!
//! * [`Backend`]: an HTTP/1.1 server on `127.0.0.1:<ephemeral>`, running on
//!   its own thread and tokio runtime (usable from `#[test]` and
//!   `#[tokio::test]` alike) and stopped when dropped. Constructors pick a
//!   behaviour: [`echo`](Backend::echo), [`fixed`](Backend::fixed),
//!   [`slow`](Backend::slow), [`reset`](Backend::reset),
//!   [`close_mid_body`](Backend::close_mid_body),
//!   [`chunked`](Backend::chunked), [`close_delimited`](Backend::close_delimited),
//!   [`huge`](Backend::huge), [`sink`](Backend::sink),
//!   [`raw_response`](Backend::raw_response),
//!   [`close_after_each`](Backend::close_after_each),
//!   [`idle_closer`](Backend::idle_closer) and [`hang`](Backend::hang).
//!   Counters ([`connections_accepted`](Backend::connections_accepted),
//!   [`requests_served`](Backend::requests_served),
//!   [`in_flight`](Backend::in_flight)) let tests assert connection reuse.
//! * [`Client`] / [`BlockingClient`]: a keep-alive HTTP/1.1 client, and
//!   [`send_raw_once`] / [`status_of`] for raw exchanges.
//! * [`pattern()`], [`pattern_hash`] and [`Hasher`] (FNV-1a 64): deterministic
//!   large bodies that are hashed on both ends instead of being compared.
//! * [`chunked`]: a small chunked-coding decoder and encoder.
//! * [`certs`]: a throw-away CA and the leaf certificates it signs, as PEM files.
//! * [`Backend::echo_tls`] with a [`TlsServer`] (optionally requiring a client
//!   certificate; [`Backend::sni_seen`] lists the SNI of each handshake), and
//!   [`Client::connect_tls`].
//! * [`H2Backend`]: an HTTP/2 (h2c, or h2 over TLS) echo server on the `h2` crate:
//!   echoes each request's body as it arrives, reports its head in `x-*` fields and
//!   ends with trailers; can send GOAWAY after a number of streams per connection.
//! * [`h2_raw`]: a raw HTTP/2 client that writes hand-made frames (floods, protocol
//!   abuse) and reads the server's frames undecoded, for the attack tests.
//! * [`WsBackend`]: a WebSocket echo server (HTTP/1.1 Upgrade), with the frame helpers
//!   [`ws_backend::ws_frame`] and [`ws_backend::parse_frame`] for the client side.
//! * [`tls_hello::client_hello_with_sni`]: a ClientHello with any server name, even an
//!   illegal one.
//! * [`dns::DnsServer`]: a small authoritative DNS server (A, AAAA, SRV records set and
//!   changed while it runs, a TTL, an outage switch) for the discovery tests.
//! * [`redis::RedisServer`]: a `redis-server` process on a free port, for the shared rate
//!   limit tests (skipped with a message where the Debian package is not installed).
//! * [`otlp::OtlpReceiver`]: an OTLP/HTTP trace receiver that decodes what Weir exports
//!   (protobuf, `opentelemetry-proto`), for the tracing tests.
//! * [`wait_until`] / [`wait_until_async`]: poll a condition instead of
//!   sleeping a fixed time.

mod backend;
mod behaviours;
pub mod certs;
pub mod chunked;
mod client;
pub mod dns;
mod h2_backend;
pub mod h2_raw;
pub mod h3_client;
pub mod otlp;
mod pattern;
pub mod redis;
mod server_thread;
mod tls_backend;
pub mod tls_hello;
mod wire;
pub mod ws_backend;

use std::time::{Duration, Instant};

pub use backend::Backend;
pub use client::{
    send_raw_once, send_raw_once_blocking, status_of, BlockingClient, Client, Response, CLOSE_WAIT,
    DEFAULT_TIMEOUT,
};
pub use h2_backend::{quote_name, H2Backend, FORBIDDEN_TRAILERS, REFUSE};
pub use pattern::{
    fill_pattern, hash_bytes, pattern, pattern_byte, pattern_hash, pattern_vec, sink_summary,
    Hasher,
};
pub use tls_backend::TlsServer;
pub use ws_backend::WsBackend;

/// How often [`wait_until`] and [`wait_until_async`] re-check their condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Polls `cond` every 5 ms until it returns true (then returns true) or
/// `timeout` has passed (then returns false after one last check). It blocks
/// the calling thread: inside an async test prefer [`wait_until_async`]
/// (backends run on their own threads, so either works for their counters).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Async [`wait_until`]: polls `cond` every 5 ms with `tokio::time::sleep`.
pub async fn wait_until_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
