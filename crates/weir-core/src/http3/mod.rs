//! HTTP/3 on TLS listeners with `http3` on (issue 28, docs/http3.md): a third client
//! protocol on the one request path.
//!
//! Each worker runs a QUIC endpoint (`quinn`, over the listener's rustls config with ALPN
//! `h3`: the same certificates and SNI resolver) on a UDP socket of its own, bound with
//! SO_REUSEPORT to the listener's address and port (`endpoint`); the kernel spreads
//! datagrams over the workers by their addresses, so a connection stays on one worker and
//! no datagram crosses threads. A connection (`conn`) runs the `h3` server; each request
//! stream (`stream`) is an adapter like `http2::stream`: an HTTP/1.1 head and
//! `request::Request`, the routing decision, Weir's answers from the same rendering, and
//! for a forward the driver with a `Sender` whose client half is the stream
//! (`exchange` to HTTP/1.1 upstreams, `upstream` to HTTP/2 ones; `body`).

mod body;
mod conn;
mod endpoint;
mod exchange;
mod guard;
mod handshake;
mod interim;
mod send;
mod stream;
mod upstream;

pub(crate) use endpoint::{bind_udp, spawn};
