//! What each kind of [`Backend`] answers, and its constructor.
//!
//! Common rules: responses are `HTTP/1.1`; a response that ends the
//! connection carries `Connection: close` (except where a behaviour is
//! documented to close silently or abruptly); an HTTP/1.0 request that asked
//! for keep-alive gets `Connection: keep-alive`. A request with
//! `Expect: 100-continue` and a body gets `100 Continue` before its body is
//! read. Requests with both Transfer-Encoding and Content-Length are read as
//! chunked and the connection is closed after the response. HEAD requests get
//! the head only (with the Content-Length a GET would have had).

use std::fmt::Display;
use std::io;
use std::time::Duration;

use crate::backend::{Backend, RequestHead};
use crate::pattern::{fill_pattern, pattern_vec, Hasher, PATTERN_BLOCK};
use crate::wire::{body_framing, Conn, Framing};

/// The behaviour a backend was created with.
#[derive(Debug, Clone)]
pub(crate) enum Behaviour {
    /// echo, slow, close_after_each and idle_closer.
    Echo {
        name: String,
        delay: Duration,
        close_each: bool,
        close_after: Option<usize>,
    },
    Fixed {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    Reset,
    CloseMidBody,
    Chunked {
        chunks: Vec<Vec<u8>>,
    },
    CloseDelimited {
        body: Vec<u8>,
    },
    Huge {
        len: u64,
    },
    Sink,
    Raw {
        bytes: Vec<u8>,
    },
    Hang,
}

/// What the connection does after a request has been handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// Wait for the next request.
    KeepAlive,
    /// Send FIN and close.
    Close,
    /// Drop the socket as is (for `reset`, with SO_LINGER 0, i.e. a RST).
    Abort,
}

impl Backend {
    /// 200 with header `X-Backend: <name>`; the body is the request head
    /// exactly as received (request line, fields, final CRLF) followed by the
    /// decoded request body. Content-Length framed; keep-alive.
    pub fn echo(name: &str) -> Backend {
        Backend::spawn(Behaviour::Echo {
            name: name.to_string(),
            delay: Duration::ZERO,
            close_each: false,
            close_after: None,
        })
    }

    /// The same response to every request: `status`, the given header fields
    /// in order, and `body`. Content-Length is added unless the headers
    /// already contain Content-Length or Transfer-Encoding, or the status
    /// (1xx, 204, 304) has no body, in which case no body is sent either. A
    /// `Connection: close` among the headers makes the backend close after
    /// answering.
    pub fn fixed(status: u16, headers: &[(&str, &str)], body: &str) -> Backend {
        Backend::spawn(Behaviour::Fixed {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
        })
    }

    /// Like [`echo`](Self::echo) named `slow`, but waits `delay` after reading
    /// the request before answering.
    pub fn slow(delay: Duration) -> Backend {
        Backend::spawn(Behaviour::Echo {
            name: "slow".to_string(),
            delay,
            close_each: false,
            close_after: None,
        })
    }

    /// Reads a request head, then closes the connection with a RST
    /// (SO_LINGER 0) without answering.
    pub fn reset() -> Backend {
        Backend::spawn(Behaviour::Reset)
    }

    /// Reads the request, answers `200` with `Content-Length: 1000` but sends
    /// only the first 100 [`pattern`](crate::pattern()) bytes, then closes (FIN).
    pub fn close_mid_body() -> Backend {
        Backend::spawn(Behaviour::CloseMidBody)
    }

    /// 200 with `Transfer-Encoding: chunked` and `Trailer: X-Trailer`; each
    /// non-empty element of `chunks` is written as one chunk in its own write,
    /// followed by the last chunk and the trailer `X-Trailer: done`. An
    /// HTTP/1.0 request gets the chunks concatenated as a close-delimited body.
    pub fn chunked(chunks: &[&str]) -> Backend {
        Backend::spawn(Behaviour::Chunked {
            chunks: chunks.iter().map(|c| c.as_bytes().to_vec()).collect(),
        })
    }

    /// 200 with `Connection: close` and neither Content-Length nor
    /// Transfer-Encoding: `body`, then close (FIN).
    pub fn close_delimited(body: &str) -> Backend {
        Backend::spawn(Behaviour::CloseDelimited {
            body: body.as_bytes().to_vec(),
        })
    }

    /// 200 with `Content-Length: len` and body `pattern(len)`, generated and
    /// written 64 KiB at a time (never held whole in memory). Keep-alive.
    pub fn huge(len: u64) -> Backend {
        Backend::spawn(Behaviour::Huge { len })
    }

    /// Streams the request body (Content-Length or chunked) through a
    /// [`Hasher`] and answers 200 with body [`sink_summary`](crate::sink_summary)
    /// `"<len> <hash as 16 hex digits>\n"`. Keep-alive.
    pub fn sink() -> Backend {
        Backend::spawn(Behaviour::Sink)
    }

    /// After reading each request (head and body), writes exactly `bytes`
    /// and closes (FIN). For malformed or unusual responses.
    pub fn raw_response(bytes: &[u8]) -> Backend {
        Backend::spawn(Behaviour::Raw {
            bytes: bytes.to_vec(),
        })
    }

    /// Like [`echo`](Self::echo) named `close-after-each`, but every response
    /// carries `Connection: close` and the backend then closes the connection.
    pub fn close_after_each() -> Backend {
        Backend::spawn(Behaviour::Echo {
            name: "close-after-each".to_string(),
            delay: Duration::ZERO,
            close_each: true,
            close_after: None,
        })
    }

    /// Like [`echo`](Self::echo) named `idle-closer`, but closes each
    /// connection (FIN, without any `Connection: close` header) right after
    /// its `after_requests`-th response. Values below 1 count as 1.
    pub fn idle_closer(after_requests: usize) -> Backend {
        Backend::spawn(Behaviour::Echo {
            name: "idle-closer".to_string(),
            delay: Duration::ZERO,
            close_each: false,
            close_after: Some(after_requests.max(1)),
        })
    }

    /// Accepts and reads a request head, then never answers; the connection
    /// stays open until the peer closes it (the request stays
    /// [`in_flight`](Self::in_flight) until then).
    pub fn hang() -> Backend {
        Backend::spawn(Behaviour::Hang)
    }
}

/// Handles one request whose head has been read.
pub(crate) async fn handle(
    conn: &mut Conn,
    req: &RequestHead,
    behaviour: &Behaviour,
    served_before: usize,
) -> io::Result<After> {
    match behaviour {
        Behaviour::Reset => {
            let _ = conn.stream.tcp().set_zero_linger();
            return Ok(After::Abort);
        }
        Behaviour::Hang => loop {
            conn.buf.clear();
            if conn.fill().await? == 0 {
                return Ok(After::Abort);
            }
        },
        _ => {}
    }

    let framing = body_framing(&req.headers, true)?;
    let smuggling_risk =
        req.header("transfer-encoding").is_some() && req.header("content-length").is_some();
    if framing != Framing::Empty && req.version >= 1 && req.has_token("expect", "100-continue") {
        conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let keep_alive = req.keep_alive() && !smuggling_risk;
    let head_only = req.method.eq_ignore_ascii_case("HEAD");

    match behaviour {
        Behaviour::Echo {
            name,
            delay,
            close_each,
            close_after,
        } => {
            let mut body = req.raw.clone();
            conn.read_body(framing, |d| body.extend_from_slice(d))
                .await?;
            if !delay.is_zero() {
                tokio::time::sleep(*delay).await;
            }
            let keep = keep_alive && !close_each;
            let mut out = Head::new(200)
                .field("X-Backend", name)
                .field("Content-Length", body.len())
                .connection(req, keep)
                .finish();
            if !head_only {
                out.extend_from_slice(&body);
            }
            conn.write_all(&out).await?;
            let idle_close = close_after.is_some_and(|n| served_before + 1 >= n);
            Ok(if keep && !idle_close {
                After::KeepAlive
            } else {
                After::Close
            })
        }
        Behaviour::Fixed {
            status,
            headers,
            body,
        } => {
            conn.read_body(framing, |_| {}).await?;
            let no_body = *status < 200 || *status == 204 || *status == 304;
            let has_framing = headers.iter().any(|(n, _)| {
                n.eq_ignore_ascii_case("content-length")
                    || n.eq_ignore_ascii_case("transfer-encoding")
            });
            let user_close = crate::wire::has_token(headers, "connection", "close");
            let keep = keep_alive && !user_close;
            let mut head = Head::new(*status);
            for (n, v) in headers {
                head = head.field(n, v);
            }
            if !no_body && !has_framing {
                head = head.field("Content-Length", body.len());
            }
            if !user_close {
                head = head.connection(req, keep);
            }
            let mut out = head.finish();
            if !no_body && !head_only {
                out.extend_from_slice(body);
            }
            conn.write_all(&out).await?;
            Ok(if keep { After::KeepAlive } else { After::Close })
        }
        Behaviour::CloseMidBody => {
            conn.read_body(framing, |_| {}).await?;
            let mut out = Head::new(200).field("Content-Length", 1000).finish();
            out.extend_from_slice(&pattern_vec(100));
            conn.write_all(&out).await?;
            Ok(After::Close)
        }
        Behaviour::Chunked { chunks } => {
            conn.read_body(framing, |_| {}).await?;
            let http11 = req.version >= 1;
            let keep = keep_alive && http11;
            let mut head = Head::new(200);
            if http11 {
                head = head
                    .field("Transfer-Encoding", "chunked")
                    .field("Trailer", "X-Trailer");
            }
            conn.write_all(&head.connection(req, keep).finish()).await?;
            if !head_only {
                for chunk in chunks.iter().filter(|c| !c.is_empty()) {
                    if http11 {
                        let mut piece = format!("{:x}\r\n", chunk.len()).into_bytes();
                        piece.extend_from_slice(chunk);
                        piece.extend_from_slice(b"\r\n");
                        conn.write_all(&piece).await?;
                    } else {
                        conn.write_all(chunk).await?;
                    }
                }
                if http11 {
                    conn.write_all(b"0\r\nX-Trailer: done\r\n\r\n").await?;
                }
            }
            Ok(if keep { After::KeepAlive } else { After::Close })
        }
        Behaviour::CloseDelimited { body } => {
            conn.read_body(framing, |_| {}).await?;
            let mut out = Head::new(200).field("Connection", "close").finish();
            if !head_only {
                out.extend_from_slice(body);
            }
            conn.write_all(&out).await?;
            Ok(After::Close)
        }
        Behaviour::Huge { len } => {
            conn.read_body(framing, |_| {}).await?;
            let head = Head::new(200)
                .field("Content-Length", len)
                .connection(req, keep_alive)
                .finish();
            conn.write_all(&head).await?;
            if !head_only {
                let mut buf = vec![0; PATTERN_BLOCK];
                let mut off = 0u64;
                while off < *len {
                    let n = (*len - off).min(PATTERN_BLOCK as u64) as usize;
                    fill_pattern(off, &mut buf[..n]);
                    conn.write_all(&buf[..n]).await?;
                    off += n as u64;
                }
            }
            Ok(if keep_alive {
                After::KeepAlive
            } else {
                After::Close
            })
        }
        Behaviour::Sink => {
            let mut hasher = Hasher::new();
            conn.read_body(framing, |d| hasher.update(d)).await?;
            let body = hasher.summary();
            let mut out = Head::new(200)
                .field("Content-Length", body.len())
                .connection(req, keep_alive)
                .finish();
            if !head_only {
                out.extend_from_slice(body.as_bytes());
            }
            conn.write_all(&out).await?;
            Ok(if keep_alive {
                After::KeepAlive
            } else {
                After::Close
            })
        }
        Behaviour::Raw { bytes } => {
            conn.read_body(framing, |_| {}).await?;
            conn.write_all(bytes).await?;
            Ok(After::Close)
        }
        Behaviour::Reset | Behaviour::Hang => unreachable!("handled above"),
    }
}

/// Builder for a response head.
struct Head(Vec<u8>);

impl Head {
    fn new(status: u16) -> Head {
        Head(format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes())
    }

    fn field(mut self, name: &str, value: impl Display) -> Head {
        self.0
            .extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        self
    }

    /// Adds the Connection field the request's keep-alive state calls for.
    fn connection(self, req: &RequestHead, keep: bool) -> Head {
        if !keep {
            self.field("Connection", "close")
        } else if req.version == 0 {
            self.field("Connection", "keep-alive")
        } else {
            self
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(b"\r\n");
        self.0
    }
}

/// Reason phrase for common status codes.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}
