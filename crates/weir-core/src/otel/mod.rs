//! OpenTelemetry traces (`[tracing]`): a server span per sampled request and a client
//! span per upstream attempt, W3C Trace Context in and out, exported over OTLP/HTTP.
//!
//! Cost: without `[tracing]` the snapshot has no [`Tracer`] and [`begin`] returns at its
//! first check; nothing else looks at tracing (the request carries a `None`). With it, an
//! unsampled request costs the `traceparent` lookup (for parent-based sampling; only
//! from trusted sources) and one random number against the ratio. A sampled request gets
//! a [`RequestTrace`] (one allocation) whose spans go to the exporter's bounded queue
//! (`export`) when they end: never a wait, a full queue drops and counts.
//!
//! Propagation: the client's `traceparent` / `tracestate` are honoured only from a peer
//! in the listener's `trusted_proxies` (none when there are none); from another peer the
//! request starts a new trace. A sampled request's upstream request carries Weir's
//! own `traceparent` (the attempt's client span as parent) and the trusted `tracestate`;
//! an unsampled one is forwarded with the headers it came with.

mod context;
pub mod export;

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use weir_config::{Listener, Route, Tracing, Upstream, UpstreamServer};

use crate::request::Request;
use crate::upstream::lb::rng::XorShift;

pub use context::push_hex;

/// A `[tracing]` config at work: its sampling ratio and the exporter's queue.
pub struct Tracer {
    pub config: Tracing,
    threshold: u64,
    queue: SyncSender<Queued>,
}

/// What the exporter's queue carries.
enum Queued {
    Span(SpanRecord),
    /// Send everything queued before `by`, then signal `done` (at shutdown).
    Flush {
        by: Instant,
        done: Sender<()>,
    },
}

impl Tracer {
    /// Starts the exporter thread of `config`; it ends once this tracer (and every
    /// request's reference to it) is gone.
    pub fn start(config: Tracing) -> std::io::Result<Arc<Tracer>> {
        let tls = export::tls_client(&config)?;
        let (queue, rx) = sync_channel(config.queue_size);
        let exporter = config.clone();
        std::thread::Builder::new()
            .name("weir-otlp".into())
            .spawn(move || export::run(rx, exporter, tls))?;
        Ok(Arc::new(Tracer {
            threshold: threshold(config.sampling),
            config,
            queue,
        }))
    }

    /// Hands a finished span to the exporter, or drops and counts it when the queue is
    /// full (the collector slow or down).
    fn send(&self, span: SpanRecord) {
        match self.queue.try_send(Queued::Span(span)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                export::STATS
                    .dropped_queue_full
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Has the exporter send the spans queued so far and waits for it until `by` (the
    /// process is ending: the workers, and so every span, are done).
    pub fn flush(&self, by: Instant) {
        let (done, finished) = channel();
        let mut flush = Queued::Flush { by, done };
        loop {
            match self.queue.try_send(flush) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(back)) if Instant::now() < by => {
                    // The queue is full and being sent: a moment for room.
                    flush = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return,
            }
        }
        let _ = finished.recv_timeout(by.saturating_duration_since(Instant::now()));
    }
}

/// `ratio` of the u64 range: a random number below it samples.
fn threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else {
        (ratio * 18_446_744_073_709_551_616.0) as u64
    }
}

fn sampled(rng: &RefCell<XorShift>, threshold: u64) -> bool {
    threshold == u64::MAX || rng.borrow_mut().next_u64() < threshold
}

thread_local! {
    /// This worker's sampling draws and ids (seeded per thread: workers do not repeat
    /// each other's ids).
    static RNG: RefCell<XorShift> = RefCell::new(XorShift::from_entropy());
}

/// Whether request `r` is traced, and if so its trace. `route`: the route it took (its
/// `tracing.sampling` overrides the global ratio for new traces). Called only with
/// `[tracing]` (`proxy::route::Routing::trace`).
#[inline(never)]
pub fn begin(
    tracer: &Arc<Tracer>,
    listener: &Listener,
    route: Option<&Route>,
    r: &Request<'_>,
) -> Option<std::rc::Rc<RequestTrace>> {
    // Without `trusted_proxies` no peer is trusted: a client could otherwise choose its
    // trace id and force sampling (a sampled parent decides for its trace).
    let trusted = &listener.policy.trusted_proxies;
    let from_trusted = trusted.iter().any(|c| c.contains(r.origin.peer_ip));
    let (parent, state) = match from_trusted {
        true => context::incoming(r.buf, r.req),
        false => (None, None),
    };
    RNG.with(|rng| start(tracer, route, r, parent, state, rng))
}

/// The sampling decision and, when sampled, the trace (ids from `rng`).
fn start(
    tracer: &Arc<Tracer>,
    route: Option<&Route>,
    r: &Request<'_>,
    parent: Option<context::Parent>,
    state: Option<&[u8]>,
    rng: &RefCell<XorShift>,
) -> Option<std::rc::Rc<RequestTrace>> {
    let sample = match parent {
        Some(p) => p.sampled,
        None => {
            let t = route
                .and_then(|r| r.trace_sampling)
                .map_or(tracer.threshold, threshold);
            sampled(rng, t)
        }
    };
    if !sample {
        return None;
    }
    let mut rng = rng.borrow_mut();
    let trace_id = match parent {
        Some(p) => p.trace_id,
        None => new_id(&mut rng),
    };
    let span_id = new_span_id(&mut rng);
    let seed = rng.next_u64();
    drop(rng);
    Some(std::rc::Rc::new(RequestTrace {
        tracer: tracer.clone(),
        trace_id,
        span_id,
        parent: parent.map(|p| p.span_id),
        state: state.map(|s| String::from_utf8_lossy(s).into_owned()),
        started: r.started,
        wall: export::unix_nanos(SystemTime::now()) - elapsed_nanos(r.started),
        method: String::from_utf8_lossy(&r.buf[r.req.method.clone()]).into_owned(),
        server: RefCell::new(server_attributes(r, route)),
        protocol: r.protocol,
        rng: Cell::new(seed),
        attempt: RefCell::new(None),
        sends: Cell::new(0),
    }))
}

fn new_id(rng: &mut XorShift) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&rng.next_u64().to_be_bytes());
    id[8..].copy_from_slice(&rng.next_u64().to_be_bytes());
    id
}

fn new_span_id(rng: &mut XorShift) -> [u8; 8] {
    rng.next_u64().max(1).to_be_bytes()
}

fn elapsed_nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(0)
}

/// The attributes of the server span known when the request is routed.
fn server_attributes(r: &Request<'_>, route: Option<&Route>) -> Vec<(&'static str, Value)> {
    let (buf, req) = (r.buf, r.req);
    let text = |b: &[u8]| Value::Str(String::from_utf8_lossy(b).into_owned());
    let mut a = vec![
        ("http.request.method", text(&buf[req.method.clone()])),
        (
            "url.path",
            text(req.path(buf).split(|b| *b == b'?').next().unwrap_or(b"")),
        ),
        (
            "url.scheme",
            Value::Static(if r.origin.tls.is_some() {
                "https"
            } else {
                "http"
            }),
        ),
        (
            "network.protocol.version",
            Value::Static(protocol_version(r)),
        ),
        ("client.address", text(r.origin.client_text().as_bytes())),
    ];
    if let Some(host) = Some(req.host_name(buf)).filter(|h| !h.is_empty()) {
        a.push(("server.address", text(host)));
    }
    if let Some(route) = route {
        a.push(("http.route", Value::Str(route.path_prefix.clone())));
        a.push(("weir.route", Value::Str(route.name.clone())));
    }
    if !r.origin.request_id.is_empty() {
        a.push(("weir.request_id", text(r.origin.request_id)));
    }
    a
}

fn protocol_version(r: &Request<'_>) -> &'static str {
    match r.protocol {
        crate::metrics::shard::Protocol::Http2 => "2",
        crate::metrics::shard::Protocol::Http3 => "3",
        _ if r.req.minor_version == 0 => "1.0",
        _ => "1.1",
    }
}

/// A sampled request's trace: its server span, open until [`RequestTrace::finish`], and
/// the client span of the attempt in progress.
pub struct RequestTrace {
    tracer: Arc<Tracer>,
    pub trace_id: [u8; 16],
    /// The server span's id.
    pub span_id: [u8; 8],
    /// The trusted caller's span.
    parent: Option<[u8; 8]>,
    state: Option<String>,
    started: Instant,
    /// Unix time of `started`, in nanoseconds.
    wall: u64,
    method: String,
    /// The server span's attributes (taken when it ends).
    server: RefCell<Vec<(&'static str, Value)>>,
    /// The client's protocol (which side carries an attempt).
    protocol: crate::metrics::shard::Protocol,
    /// Span ids of the attempts (xorshift state).
    rng: Cell<u64>,
    attempt: RefCell<Option<OpenAttempt>>,
    /// Attempts begun so far (`http.request.resend_count` of the next is this).
    sends: Cell<u32>,
}

/// The client span of an attempt in progress.
struct OpenAttempt {
    span_id: [u8; 8],
    started: Instant,
    attributes: Vec<(&'static str, Value)>,
}

/// How an attempt ended.
pub enum AttemptEnd {
    /// Its response is relayed: the span ends with the request.
    Relayed,
    /// It failed, or its response was not relayed (`status`: the head it had, if any).
    Failed {
        status: Option<u16>,
        error: &'static str,
    },
    /// Nothing was sent: no span.
    Unsent,
}

impl RequestTrace {
    /// Opens the client span of an attempt on `server` of `upstream`.
    pub fn begin_attempt(&self, server: &UpstreamServer, upstream: &Upstream) {
        let h2 = crate::forward::carrier(self.protocol, upstream) == crate::forward::Carrier::Http2;
        let mut rng = XorShift::new(self.rng.get());
        let span_id = new_span_id(&mut rng);
        self.rng.set(rng.next_u64());
        let resends = self.sends.get();
        self.sends.set(resends + 1);
        let host = server
            .name
            .rsplit_once(':')
            .map_or(&*server.name, |(h, _)| h);
        let mut attributes = vec![
            ("http.request.method", Value::Str(self.method.clone())),
            (
                "server.address",
                Value::Str(host.trim_matches(['[', ']']).to_owned()),
            ),
            ("server.port", Value::Int(i64::from(server.addr.port()))),
            (
                "network.protocol.version",
                Value::Static(if h2 { "2" } else { "1.1" }),
            ),
        ];
        if resends > 0 {
            attributes.push(("http.request.resend_count", Value::Int(i64::from(resends))));
        }
        // An attempt left open (a cell that did not say how it ended) ends here.
        self.end_attempt(AttemptEnd::Failed {
            status: None,
            error: "abandoned",
        });
        *self.attempt.borrow_mut() = Some(OpenAttempt {
            span_id,
            started: Instant::now(),
            attributes,
        });
    }

    /// Ends the attempt in progress as `end` says (a relayed one stays open).
    pub fn end_attempt(&self, end: AttemptEnd) {
        let (status, error) = match end {
            AttemptEnd::Relayed => return,
            AttemptEnd::Unsent => {
                self.attempt.borrow_mut().take();
                self.sends.set(self.sends.get().saturating_sub(1));
                return;
            }
            AttemptEnd::Failed { status, error } => (status, error),
        };
        if let Some(open) = self.attempt.borrow_mut().take() {
            self.send_client(open, status, Some(error));
        }
    }

    /// Appends the `traceparent` (and `tracestate`) lines of the upstream request: the
    /// attempt's span as its parent.
    pub fn push_headers(&self, out: &mut Vec<u8>) {
        let attempt = self.attempt.borrow();
        let parent = attempt.as_ref().map_or(&self.span_id, |a| &a.span_id);
        out.extend_from_slice(b"traceparent: ");
        context::push_traceparent(out, &self.trace_id, parent);
        out.extend_from_slice(b"\r\n");
        if let Some(state) = &self.state {
            out.extend_from_slice(b"tracestate: ");
            out.extend_from_slice(state.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Ends the request's spans: the relayed attempt's and the server span, answered
    /// with `status`; `error`: why it failed, if it did.
    pub fn finish(&self, status: u16, error: Option<&'static str>) {
        if let Some(open) = self.attempt.borrow_mut().take() {
            let failed = error.or((status >= 400).then_some(""));
            self.send_client(open, Some(status), failed);
        }
        let mut attributes = std::mem::take(&mut *self.server.borrow_mut());
        attributes.push(("http.response.status_code", Value::Int(i64::from(status))));
        // A server span is an error for a 5xx (a 4xx is the client's).
        let error = error.or((status >= 500).then_some(""));
        if let Some(e) = error {
            let kind = if e.is_empty() {
                status.to_string()
            } else {
                e.to_owned()
            };
            attributes.push(("error.type", Value::Str(kind)));
        }
        let route = attributes.iter().find(|(k, _)| *k == "http.route");
        let name = match route {
            Some((_, r)) => format!("{} {}", self.method, r.text()),
            None => self.method.clone(),
        };
        self.tracer.send(SpanRecord {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            remote_parent: self.parent.is_some(),
            trace_state: self.state.clone(),
            kind: Kind::Server,
            name,
            start: self.wall,
            end: self.wall + elapsed_nanos(self.started),
            attributes,
            error: error.map(|e| {
                if e.is_empty() {
                    status.to_string()
                } else {
                    e.to_owned()
                }
            }),
        });
    }

    fn send_client(&self, open: OpenAttempt, status: Option<u16>, error: Option<&str>) {
        let mut attributes = open.attributes;
        if let Some(status) = status {
            attributes.push(("http.response.status_code", Value::Int(i64::from(status))));
        }
        // "": the status is the error.
        let error = error.map(|e| match (e, status) {
            ("", Some(s)) => s.to_string(),
            ("", None) => "error".to_owned(),
            (e, _) => e.to_owned(),
        });
        if let Some(e) = &error {
            attributes.push(("error.type", Value::Str(e.clone())));
        }
        let start = self.wall + nanos_between(self.started, open.started);
        self.tracer.send(SpanRecord {
            trace_id: self.trace_id,
            span_id: open.span_id,
            parent: Some(self.span_id),
            remote_parent: false,
            trace_state: self.state.clone(),
            kind: Kind::Client,
            name: self.method.clone(),
            start,
            end: self.wall + elapsed_nanos(self.started),
            attributes,
            error,
        });
    }
}

fn nanos_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(0)
}

/// A finished span, as the exporter encodes it.
pub struct SpanRecord {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    remote_parent: bool,
    trace_state: Option<String>,
    kind: Kind,
    name: String,
    start: u64,
    end: u64,
    attributes: Vec<(&'static str, Value)>,
    /// The span's status is Error, with this description.
    error: Option<String>,
}

#[derive(Clone, Copy)]
enum Kind {
    Server,
    Client,
}

/// An attribute's value.
enum Value {
    Str(String),
    Static(&'static str),
    Int(i64),
}

impl Value {
    fn text(&self) -> &str {
        match self {
            Value::Str(s) => s,
            Value::Static(s) => s,
            Value::Int(_) => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_cover_the_ratio() {
        assert_eq!(threshold(1.0), u64::MAX);
        assert_eq!(threshold(0.0), 0);
        let rng = RefCell::new(XorShift::new(7));
        let t = threshold(0.25);
        let n = (0..40_000).filter(|_| sampled(&rng, t)).count();
        assert!((9_000..11_000).contains(&n), "{n}");
        assert!(!(0..1000).any(|_| sampled(&rng, 0)));
    }
}
