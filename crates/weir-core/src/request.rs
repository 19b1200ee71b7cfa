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
