//! The span exporter: one thread per `[tracing]` config, fed by a bounded channel, that
//! batches finished spans and posts them to the collector as OTLP/HTTP protobuf
//! (`ExportTraceServiceRequest`, the OpenTelemetry project's generated messages).
//!
//! Why not the OpenTelemetry SDK's batch processor: it bounds its queue, but counts the
//! spans it drops only in a log line at shutdown, and its HTTP exporters bring a client
//! stack (reqwest or hyper with tower) this tree does not otherwise need. Here a worker
//! hands a span over with `try_send` (never blocks: a full queue drops the span and
//! counts it in `weir_tracing_spans_dropped_total`), and the thread posts with blocking
//! I/O under `timeout`, so a slow or dead collector only fills the queue.
//!
//! An `https://` endpoint is reached over TLS (rustls, the system's roots or `ca_file`).
//! At shutdown, once the workers are gone, [`super::Tracer::flush`] has the thread send
//! what is queued, for at most `timeout`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Instant;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use weir_config::Tracing;

use super::{Kind, Queued, SpanRecord, Value};
use crate::connector::tls::{host_of, provider, roots};

/// The exporter's counts, process-wide (`weir_tracing_*`).
#[derive(Debug, Default)]
pub struct Stats {
    pub exported: AtomicU64,
    /// Dropped because the queue was full (the collector slow or down).
    pub dropped_queue_full: AtomicU64,
    /// Dropped because their export request failed (refused, timed out, not 2xx).
    pub dropped_export_failed: AtomicU64,
}

/// Every exporter of the process counts here (a reload that changes `[tracing]` starts
/// a new exporter; its counts carry on).
pub static STATS: Stats = Stats {
    exported: AtomicU64::new(0),
    dropped_queue_full: AtomicU64::new(0),
    dropped_export_failed: AtomicU64::new(0),
};

/// Runs until every sender is gone (the config's last snapshot dropped), then sends what
/// is left and returns.
pub(super) fn run(rx: Receiver<Queued>, config: Tracing, tls: Option<Arc<ClientConfig>>) {
    let mut conn = Collector {
        config,
        tls,
        stream: None,
        body: Vec::new(),
        response: Vec::new(),
    };
    let mut batch = Vec::with_capacity(conn.config.batch_size);
    loop {
        let deadline = Instant::now() + conn.config.batch_delay;
        let filled = fill(&rx, &mut batch, conn.config.batch_size, deadline);
        conn.send(&mut batch);
        match filled {
            Filled::Batch => {}
            Filled::Flush { by, done } => {
                conn.send_queued(&rx, &mut batch, by);
                let _ = done.send(());
            }
            Filled::Closed => return,
        }
    }
}

/// Why [`fill`] returned.
enum Filled {
    /// The batch is full or its delay passed.
    Batch,
    /// A flush was asked for: send everything queued until `by`, then signal `done`.
    Flush { by: Instant, done: Sender<()> },
    /// Every sender is gone.
    Closed,
}

/// Takes spans into `batch` until it holds `max` or `deadline` passes.
fn fill(
    rx: &Receiver<Queued>,
    batch: &mut Vec<SpanRecord>,
    max: usize,
    deadline: Instant,
) -> Filled {
    while batch.len() < max {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Queued::Span(span)) => batch.push(span),
            Ok(Queued::Flush { by, done }) => return Filled::Flush { by, done },
            Err(RecvTimeoutError::Timeout) => return Filled::Batch,
            Err(RecvTimeoutError::Disconnected) => return Filled::Closed,
        }
    }
    Filled::Batch
}

/// The TLS client of an `https://` endpoint (`None` for `http://`).
pub(super) fn tls_client(config: &Tracing) -> std::io::Result<Option<Arc<ClientConfig>>> {
    if !config.endpoint.tls {
        return Ok(None);
    }
    let roots = roots(config.ca.as_ref()).map_err(std::io::Error::other)?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(Arc::new(client)))
}

/// A connection to the collector: TCP, or TLS over it.
trait Connection: Read + Write + Send {}
impl<T: Read + Write + Send> Connection for T {}

/// The collector's connection (kept open between exports when it allows).
struct Collector {
    config: Tracing,
    tls: Option<Arc<ClientConfig>>,
    stream: Option<Box<dyn Connection>>,
    body: Vec<u8>,
    response: Vec<u8>,
}

impl Collector {
    /// Exports `batch` (emptied), counting its spans as exported or dropped.
    fn send(&mut self, batch: &mut Vec<SpanRecord>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match self.export(batch) {
            Ok(()) => STATS.exported.fetch_add(n, Relaxed),
            Err(error) => {
                tracing::debug!(%error, spans = n, "span export failed");
                STATS.dropped_export_failed.fetch_add(n, Relaxed)
            }
        };
        batch.clear();
    }

    /// Sends what is queued now, batch by batch, until the queue is empty or `by` passes
    /// (what is left then is dropped, with a warning: the process is ending).
    fn send_queued(&mut self, rx: &Receiver<Queued>, batch: &mut Vec<SpanRecord>, by: Instant) {
        let mut left = 0usize;
        while let Ok(queued) = rx.try_recv() {
            let Queued::Span(span) = queued else { continue };
            if Instant::now() >= by {
                left += 1;
                continue;
            }
            batch.push(span);
            if batch.len() == self.config.batch_size {
                self.send(batch);
            }
        }
        if Instant::now() < by {
            self.send(batch);
        } else {
            left += batch.len();
            batch.clear();
        }
        if left > 0 {
            tracing::warn!(
                spans = left,
                "spans not exported before the tracing timeout at exit"
            );
        }
    }

    fn export(&mut self, batch: &mut Vec<SpanRecord>) -> std::io::Result<()> {
        self.body.clear();
        encode(&self.config.service_name, batch.drain(..))
            .encode(&mut self.body)
            .map_err(std::io::Error::other)?;
        // A kept connection the collector closed meanwhile fails at once: one more try on
        // a new one.
        let reused = self.stream.is_some();
        match self.post() {
            Err(_) if reused => {
                self.stream = None;
                self.post()
            }
            other => other,
        }
    }

    fn post(&mut self) -> std::io::Result<()> {
        let mut stream = match self.stream.take() {
            Some(s) => s,
            None => self.connect()?,
        };
        let c = &self.config;
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n",
            c.endpoint.path,
            c.endpoint.authority,
            self.body.len()
        );
        for (name, value) in &c.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(&self.body)?;
        let (status, keep) = read_response(&mut stream, &mut self.response)?;
        if keep {
            self.stream = Some(stream);
        }
        match status {
            200..=299 => Ok(()),
            _ => Err(std::io::Error::other(format!(
                "collector answered {status}"
            ))),
        }
    }

    fn connect(&self) -> std::io::Result<Box<dyn Connection>> {
        let tcp = self.connect_tcp()?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = host_of(&self.config.endpoint.authority).to_owned();
        let name = ServerName::try_from(host).map_err(std::io::Error::other)?;
        let session = ClientConnection::new(tls.clone(), name).map_err(std::io::Error::other)?;
        // The handshake runs on the first write, under the socket's timeouts.
        Ok(Box::new(StreamOwned::new(session, tcp)))
    }

    fn connect_tcp(&self) -> std::io::Result<TcpStream> {
        let timeout = self.config.timeout;
        let mut last = std::io::Error::other("the endpoint's host has no address");
        for addr in self.config.endpoint.authority.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Most bytes of a collector's response head and body that are read (a `partial_success`
/// message is small).
const MAX_RESPONSE: usize = 64 * 1024;

/// Reads the response: its status, and whether the connection can carry the next export
/// (a `Content-Length` body read whole, no `Connection: close`).
fn read_response(stream: &mut dyn Connection, buf: &mut Vec<u8>) -> std::io::Result<(u16, bool)> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(len) = resp.parse(buf).map_err(std::io::Error::other)? {
            let status = resp.code.unwrap_or(0);
            let header = |name: &str| {
                let found = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name));
                found.map(|h| h.value)
            };
            let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"));
            let length = header("content-length")
                .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
            let Some(length) = length.filter(|n| *n <= MAX_RESPONSE && !close) else {
                return Ok((status, false));
            };
            while buf.len() < len + length {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Ok((status, false));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, buf.len() == len + length));
        }
        if buf.len() > MAX_RESPONSE {
            return Err(std::io::Error::other("collector response head too large"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The export request for `batch`: one resource (`service.name`), one scope (`weir`).
fn encode(
    service_name: &str,
    batch: impl Iterator<Item = SpanRecord>,
) -> ExportTraceServiceRequest {
    let resource = Resource {
        attributes: vec![key_value(
            "service.name",
            Value::Str(service_name.to_owned()),
        )],
        ..Default::default()
    };
    let scope = InstrumentationScope {
        name: "weir".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope),
                spans: batch.map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The span's message, taking the record's strings (no copies).
fn span(s: SpanRecord) -> Span {
    let kind = match s.kind {
        Kind::Server => span::SpanKind::Server,
        Kind::Client => span::SpanKind::Client,
    };
    let status = s.error.map(|message| Status {
        message,
        code: status::StatusCode::Error as i32,
    });
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: s.trace_state.unwrap_or_default(),
        parent_span_id: s.parent.map_or_else(Vec::new, |p| p.to_vec()),
        // Bit 8 set: whether the parent is remote is known; bit 9: it is.
        flags: 1 | 0x100 | (u32::from(s.remote_parent) << 9),
        name: s.name,
        kind: kind as i32,
        start_time_unix_nano: s.start,
        end_time_unix_nano: s.end,
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| key_value(k, v))
            .collect(),
        status,
        ..Default::default()
    }
}

fn key_value(key: &str, value: Value) -> KeyValue {
    let value = match value {
        Value::Str(s) => any_value::Value::StringValue(s),
        Value::Static(s) => any_value::Value::StringValue(s.to_owned()),
        Value::Int(i) => any_value::Value::IntValue(i),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// How long a worker's span may wait in the queue is the exporter's concern; this is
/// only the wall clock spans are stamped with.
pub(super) fn unix_nanos(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
