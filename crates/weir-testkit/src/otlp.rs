//! An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf) on `127.0.0.1:<ephemeral>`:
//! decodes each `ExportTraceServiceRequest` with the OpenTelemetry project's generated
//! messages and keeps the spans, the resource's `service.name` and the request headers,
//! for the tracing tests. It can be made to stall (a slow collector), and can serve over
//! TLS (`start_tls`, an `https://` endpoint).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
pub use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::server_thread::ServerThread;
use crate::tls_backend::TlsServer;

/// What the receiver has been sent.
#[derive(Debug, Default)]
struct Received {
    spans: Vec<Span>,
    service_names: Vec<String>,
    /// Each export request's header lines, lower-cased names.
    headers: Vec<Vec<(String, String)>>,
}

pub struct OtlpReceiver {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    stalled: Arc<AtomicBool>,
    tls: bool,
    _thread: ServerThread,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::spawn(None)
    }

    /// A receiver answering over TLS with `tls`'s certificate.
    pub fn start_tls(tls: &TlsServer) -> OtlpReceiver {
        OtlpReceiver::spawn(Some(tls))
    }

    fn spawn(tls: Option<&TlsServer>) -> OtlpReceiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let stalled = Arc::new(AtomicBool::new(false));
        let (r, s) = (received.clone(), stalled.clone());
        let acceptor = tls.map(TlsServer::acceptor);
        let with_tls = acceptor.is_some();
        let thread = ServerThread::spawn(move |listener| async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (r, s) = (r.clone(), s.clone());
                match acceptor.clone() {
                    None => drop(tokio::spawn(serve(stream, r, s))),
                    Some(acceptor) => drop(tokio::spawn(async move {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve(stream, r, s).await;
                        }
                    })),
                }
            }
        });
        OtlpReceiver {
            addr: thread.addr,
            received,
            stalled,
            tls: with_tls,
            _thread: thread,
        }
    }

    /// `http://127.0.0.1:PORT/v1/traces`, or `https://localhost:PORT/v1/traces` over TLS.
    pub fn endpoint(&self) -> String {
        match self.tls {
            false => format!("http://{}/v1/traces", self.addr),
            true => format!("https://localhost:{}/v1/traces", self.addr.port()),
        }
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap().spans.clone()
    }

    pub fn service_names(&self) -> Vec<String> {
        self.received.lock().unwrap().service_names.clone()
    }

    /// The header lines of each export request (names lower-cased).
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        self.received.lock().unwrap().headers.clone()
    }

    /// While stalled, requests are read but never answered (a collector that hangs).
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::Relaxed);
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    received: Arc<Mutex<Received>>,
    stalled: Arc<AtomicBool>,
) {
    let mut buf = Vec::new();
    loop {
        let Some((headers, body)) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        if stalled.load(Ordering::Relaxed) {
            // Hold the connection without an answer until the peer gives up.
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            return;
        }
        let Ok(export) = ExportTraceServiceRequest::decode(&body[..]) else {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
            return;
        };
        {
            let mut r = received.lock().unwrap();
            r.headers.push(headers);
            for rs in export.resource_spans {
                let attrs = rs.resource.map(|r| r.attributes).unwrap_or_default();
                if let Some(name) = string_attr(&attrs, "service.name") {
                    r.service_names.push(name.to_owned());
                }
                for ss in rs.scope_spans {
                    r.spans.extend(ss.spans);
                }
            }
        }
        let ok =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if stream.write_all(ok).await.is_err() {
            return;
        }
    }
}

/// Reads one request (its head's header lines and its `Content-Length` body); `None` at
/// the end of the connection.
async fn read_request<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Option<(Vec<(String, String)>, Vec<u8>)> {
    loop {
        let mut lines = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut lines);
        if let httparse::Status::Complete(len) = req.parse(buf).ok()? {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    let value = String::from_utf8_lossy(h.value).into_owned();
                    (h.name.to_ascii_lowercase(), value)
                })
                .collect();
            let length: usize = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse().ok())?;
            while buf.len() < len + length {
                read_more(stream, buf).await?;
            }
            let body = buf[len..len + length].to_vec();
            buf.drain(..len + length);
            return Some((headers, body));
        }
        read_more(stream, buf).await?;
    }
}

async fn read_more<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(n) if n > 0 => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
        _ => None,
    }
}

/// The value of attribute `key` among `attrs`.
fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

/// The string value of attribute `key` among `attrs`.
pub fn string_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The integer value of attribute `key` among `attrs`.
pub fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}
