//! A request as every client protocol presents it to the routing decision
//! (`proxy::route`), the upstream head writers (`forward::request_head`) and the admission
//! filters (`policy`): its HTTP/1.1 head and who sent it. Below all of them, so that none
//! imports another's module for it.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::metrics::shard::Protocol;
use crate::router::RoutedPath;
use crate::tls::session::TlsSession;

/// Who sent a request, as every client protocol knows it.
#[derive(Clone, Copy)]
pub struct Origin<'a> {
    /// The peer (after a PROXY header): what `X-Forwarded-For` gets.
    pub peer: &'a ClientIp,
    pub peer_ip: IpAddr,
    /// The client behind `trusted_proxies`, when it is not the peer.
    pub behind: Option<(IpAddr, &'a ClientIp)>,
    /// The connection's TLS session (`None`: cleartext).
    pub tls: Option<&'a TlsSession>,
    /// The request's id (empty: none).
    pub request_id: &'a [u8],
}

impl Origin<'_> {
    /// The client: behind trusted proxies, else the peer (access lists, rate keys,
    /// `X-Real-IP`, `{client_ip}`, the `client_ip` hash key, the access log).
    pub fn client_ip(&self) -> IpAddr {
        self.behind.map_or(self.peer_ip, |(ip, _)| ip)
    }

    pub fn client_text(&self) -> &ClientIp {
        self.behind.map_or(self.peer, |(_, text)| text)
    }

    pub fn scheme(&self) -> &'static [u8] {
        match self.tls {
            Some(_) => b"https",
            None => b"http",
        }
    }
}

/// A request as every client protocol presents it: its HTTP/1.1 head (`buf`, parsed into
/// `req`; an HTTP/2 stream's is written from its fields) and who sent it.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub buf: &'a [u8],
    pub req: &'a RequestHead,
    pub origin: Origin<'a>,
    /// When the head was complete (the rate limiter's clock, the first attempt's start).
    pub started: Instant,
    pub protocol: Protocol,
    /// Its trace, when it is sampled (`otel`).
    pub trace: Option<&'a crate::otel::RequestTrace>,
}

impl<'a> Request<'a> {
    /// What `{variable}`s in a redirect's `to` expand to: `{host}` without its port.
    pub fn redirect_vars<'v>(&'v self, path: &'v RoutedPath) -> Vars<'v> {
        Vars {
            host: self.req.host_name(self.buf),
            ..self.vars(path)
        }
    }

    /// What `{variable}`s in header rules expand to (`{host}` as the client sent it).
    /// `{path}` and `{uri}` are the routed path (`path`, normalised by the routing
    /// decision), the one forwarded: the raw target may say another
    /// (`//evil.com/../r/x` is routed as `/r/x`).
    pub fn vars<'v>(&'v self, path: &'v RoutedPath) -> Vars<'v> {
        Vars {
            scheme: self.origin.scheme(),
            host: (self.req.host.as_ref()).map_or(&[][..], |r| &self.buf[r.clone()]),
            target: path.get(self.req.path(self.buf)),
            client_ip: self.origin.client_text().as_bytes(),
            request_id: self.origin.request_id,
        }
    }
}

/// The server and time of the request's last try, for the access log.
#[derive(Debug, Default, Clone, Copy)]
pub struct LastTry {
    /// The upstream and server indexes.
    pub upstream_pick: Option<(usize, usize)>,
    /// From the last try's start to its final head (or its failure).
    pub upstream_time: Option<Duration>,
}

/// What the access log and metrics learn from a request's exchange, whichever protocols
/// carried it (kept in the client connection's per-request state, `client::Current`).
#[derive(Debug, Default)]
pub struct Trace {
    /// The server of the request's last try, and how long it took to answer.
    pub last_try: LastTry,
    pub status: u16,
    pub body_in: u64,
    pub body_out: u64,
    /// The client reset the stream: the upstream request was cancelled.
    pub reset: bool,
    /// Answered by Weir itself (`respond`, `redirect`), not by an upstream.
    pub local: bool,
    /// What the route's compression did to the response, if it compressed it.
    pub compressed: Option<crate::filters::compression::Compressed>,
    /// What the route's cache did.
    pub cache: Option<crate::cache::CacheResult>,
    /// The request is gRPC's (`H2Facts::grpc`): the `grpc-status` sent is recorded.
    pub grpc: bool,
    /// The `grpc-status` the client got (a gRPC request only; `None`: none, or not a
    /// number), from the upstream's head or trailers or from Weir's own answer.
    pub grpc_status: Option<u32>,
}

impl Trace {
    /// The `grpc-status` among `fields` (a response head or trailers about to go to the
    /// client) if the request is gRPC: digits only (`+5` is no status). Nothing is looked
    /// up for other requests. Recorded by [`Trace::sent_grpc_status`] once `fields` were sent.
    pub fn grpc_status_in(&self, fields: &http::HeaderMap) -> Option<u32> {
        if !self.grpc {
            return None;
        }
        let v = fields.get("grpc-status")?.as_bytes();
        if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(v).ok()?.parse().ok()
    }

    /// Notes `status` (from [`Trace::grpc_status_in`]) once its fields reached the client.
    pub fn sent_grpc_status(&mut self, status: Option<u32>) {
        if status.is_some() {
            self.grpc_status = status;
        }
    }
}
