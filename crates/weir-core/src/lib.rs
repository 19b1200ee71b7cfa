//! Weir's data plane.
//!
//! The request path, in the order a request meets the modules:
//!
//! 1. `listener/`  — SO_REUSEPORT sockets per worker, accept loop, connection limit, fd back-off
//! 2. `client`     — the client connection: buffer, request-head reading, timeouts
//! 3. `codec/`     — HTTP/1.1 parsing (strict framing), chunked decoding, head writing
//! 4. `router/`    — host + longest path prefix -> route
//! 5. `filters/`   — prefix rewrite, forwarded headers, location reverse-mapping, and the
//!    traffic-policy filters `policy` runs (header rules, request ids, access lists, ...)
//! 6. `upstream/`  — choosing a server (policies, health checks, ejection), retry decisions
//! 7. `connector/` — connecting, the per-worker keep-alive pool
//! 8. `forward/`   — the response source: one attempt-and-retry driver over an HTTP/1.1
//!    connection or an HTTP/2 stream, the response's edits, one body relay, tunnels
//! 9. `proxy/`     — the pipeline tying 1-8 together: the protocol-neutral request and
//!    routing decision, Weir's own answers, the record; the HTTP/1.x client adapter
//!
//! A cleartext connection that opens with the HTTP/2 preface leaves `proxy` for `http2/`,
//! the HTTP/2 client adapter, which turns each stream into the same request for 4-8
//! (docs/http2.md, docs/request-lifecycle.md "Adding a protocol or a response source").
//!
//! TCP (L4) listeners take a shorter path: `listener/` -> `tcp` (pick and connect through
//! `upstream/` and `connector/`, then relay bytes both ways, spliced on Linux via `sys`).
//! Both kinds may first read a PROXY protocol header (`listener/proxy_protocol`,
//! `codec/proxy_protocol`).
//! A listener with `[listeners.tls]` then runs the TLS handshake (`tls/`: certificates by
//! SNI, the shared rustls config, session facts) before its first request.
//!
//! Around it: `server` (start, workers, drain), `reload` (applying a new config while
//! running), `worker` (per-thread state), `snapshot`
//! (the published, pre-computed config), `error` (the one error -> status mapping),
//! `buffer` (bounded I/O buffers), `evict` (places under a cap that go to a newcomer,
//! idlest first: TLS handshakes, admin connections), `cluster` (what a fleet shares:
//! rate limits counted in Redis, pools following DNS).

// Unsafe code is denied everywhere but `sys` (pipes and splice), which allows it explicitly.
#![deny(unsafe_code)]

#[macro_use]
mod io_enum;

pub mod access_log;
pub mod answer;
pub mod buffer;
pub mod cache;
pub mod client;
pub mod client_stream;
pub mod cluster;
pub mod codec;
pub mod connector;
pub mod error;
pub mod evict;
pub mod files;
pub mod filters;
pub mod forward;
pub mod frame;
pub mod http2;
pub mod http3;
pub mod idle;
pub mod listener;
pub mod memory;
pub mod metrics;
pub mod otel;
pub mod places;
pub mod policy;
pub mod proxy;
pub mod reload;
pub mod request;
pub mod router;
pub mod server;
pub mod snapshot;
pub mod sys;
pub mod tcp;
#[cfg(test)]
mod test_util;
pub mod time;
pub mod tls;
pub mod upstream;
pub mod worker;

pub use error::ProxyError;
pub use reload::ApplyError;
pub use server::{BoundAddr, Inherited, InheritedBind, Proxy, StartError};
