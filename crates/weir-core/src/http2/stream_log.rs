//! What a multiplexed stream (an HTTP/2 or HTTP/3 request) leaves behind: its metrics and
//! its access-log line, written through `proxy::record` as for an HTTP/1.1 request. The
//! two stream adapters (`http2::stream`, `http3::stream`) note their request in a
//! `StreamLog` (identified as for every protocol: `policy::identify`), fill it as the
//! request runs and record it with the facts of their connection (`StreamConn`).

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Instant;

use crate::access_log::RequestFields;
use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;
use crate::filters::request_id::RequestId;
use crate::forward::Failure;
use crate::metrics::shard::{method_index, Protocol, METHODS};
use crate::otel::RequestTrace;
use crate::policy::identify;
use crate::proxy::{record, ClientSide, Done, Handled};
use crate::request::Trace;
use crate::request::{Origin, Request};
use crate::snapshot::Snapshot;
use crate::tls::session::TlsSession;
use crate::worker::Worker;

/// What a stream's access-log line and metrics are made of, filled as it runs.
pub(crate) struct StreamLog {
    pub fields: RequestFields,
    pub trace: Trace,
    /// The request's trace, when sampled (`otel`).
    pub otel: Option<Rc<RequestTrace>>,
    pub who: Who,
    pub route: Option<usize>,
    /// The method's metric slot.
    pub method: usize,
}

impl Default for StreamLog {
    fn default() -> Self {
        StreamLog {
            fields: RequestFields::default(),
            trace: Trace::default(),
            otel: None,
            who: Who::default(),
            route: None,
            // A stream that never made a request counts with the last slot ("other").
            method: METHODS.len() - 1,
        }
    }
}

/// Who sent a stream's request.
#[derive(Default)]
pub(crate) struct Who {
    pub request_id: RequestId,
    /// The client behind `trusted_proxies`, when it is not the peer.
    pub behind: Option<(IpAddr, ClientIp)>,
}

/// The connection a stream runs on, on the snapshot it started with.
pub(crate) struct StreamConn<'a> {
    pub worker: &'a Worker,
    pub snapshot: &'a Snapshot,
    /// The listener's position in `snapshot`, and its metric slot.
    pub listener: usize,
    pub slot: usize,
    /// The peer's address, and as the log writes it.
    pub peer_ip: IpAddr,
    pub ip: &'a ClientIp,
    pub tls: Option<&'a TlsSession>,
    /// `Http2` or `Http3`: the metric family of the stream count, the log's protocol.
    pub protocol: Protocol,
}

impl<'c> StreamConn<'c> {
    /// The request in `buf` / `req` (received at `started`, sent by `who`) as every client
    /// protocol presents it to the routing decision.
    pub fn request(
        &self,
        who: &'c Who,
        buf: &'c [u8],
        req: &'c RequestHead,
        started: Instant,
    ) -> Request<'c> {
        Request {
            buf,
            req,
            origin: Origin {
                peer: self.ip,
                peer_ip: self.peer_ip,
                behind: who.behind.as_ref().map(|(ip, text)| (*ip, text)),
                tls: self.tls,
                request_id: who.request_id.as_bytes(),
            },
            started,
            protocol: self.protocol,
            trace: None,
        }
    }
}

impl StreamLog {
    /// Notes the request in `buf` / `req`: identifies it (its id, the client behind
    /// `trusted_proxies`: `who`) and keeps what the access log and the metrics need.
    pub fn note(&mut self, conn: &StreamConn<'_>, buf: &[u8], req: &RequestHead) {
        let (worker, listener) = (conn.worker, &conn.snapshot.config.listeners[conn.listener]);
        let Who { behind, request_id } = &mut self.who;
        *behind = identify(worker, listener, buf, req, conn.peer_ip, request_id);
        if worker.log(conn.slot).is_some() {
            self.fields.capture(buf, req);
            self.fields.http2 = conn.protocol == Protocol::Http2;
            self.fields.http3 = conn.protocol == Protocol::Http3;
        }
        self.method = method_index(&buf[req.method.clone()]);
    }

    /// Counts the stream (its request answered with `status` after `duration`) in the
    /// worker's metrics and writes its access-log line.
    pub fn record(
        &self,
        conn: &StreamConn<'_>,
        result: Result<(), Failure>,
        status: u16,
        duration: std::time::Duration,
    ) {
        let trace = &self.trace;
        if let Some(m) = conn.worker.metrics.listener(conn.slot) {
            match conn.protocol {
                Protocol::Http3 => m.http3.streams.inc(),
                _ => m.http2.streams.inc(),
            }
        }
        let handled = Handled {
            route: self.route,
            local: trace.local,
            result: result.map(|()| true),
        };
        let done = Done {
            listener: conn.listener,
            slot: conn.slot,
            method: self.method,
            protocol: conn.protocol,
            status,
            duration,
        };
        let side = ClientSide {
            ip: self.who.behind.as_ref().map_or(conn.ip, |(_, text)| text),
            fields: &self.fields,
            bytes_in: trace.body_in,
            bytes_out: trace.body_out,
            tls: conn.tls,
            request_id: self.who.request_id.as_bytes(),
            exchange: trace,
            trace: self.otel.as_deref(),
        };
        record(conn.worker, conn.snapshot, &side, &handled, &done);
    }
}
