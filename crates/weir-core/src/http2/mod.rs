//! HTTP/2 from clients (h2c with prior knowledge on cleartext listeners, or ALPN `h2` after
//! a TLS handshake) to HTTP/1.1 or HTTP/2 upstreams; also the HTTP/2-upstream sender every
//! client protocol shares (`upstream`, with `from_http1` for HTTP/1.x clients), and the
//! stream-side pieces HTTP/3 reuses (`exchange`, `respond`, `local`, `interim`,
//! `stream_log`; `files` and `filling` for static files and the cache). See docs/http2.md.
//!
//! `client` spots the connection preface on a connection's first bytes and hands the
//! connection here. The `h2` crate does the framing, HPACK, flow control and its own
//! guards (`conn`); each accepted stream is one request (`stream`): its pseudo-headers and
//! fields become an HTTP/1.1 head (`request`) that goes through the same router, upstream
//! pick, retries, connector pool and response-head parsing as an HTTP/1.1 request
//! (`exchange`), and the response streams back within the client's flow-control window
//! (`send`), all streams together within `max_connection_send_buffer` (`outbox`). `budget`
//! holds the reset and glitch accounting, fed by `io`, which watches the frames passing
//! through (`frames`) and writes them through `gather` (the frames of many streams in one
//! system call). `websocket` bridges RFC 8441 extended CONNECTs to
//! HTTP/1.1 WebSocket upgrades. `grpc` turns the answers Weir makes itself to gRPC
//! requests into gRPC statuses. `interim` relays the upstream's 1xx heads, `trailers` an
//! HTTP/1.1 upstream's chunked trailers. `stream_log` counts a finished stream and writes
//! its access-log line (an HTTP/3 stream's too).
//!
//! Module names: `http2`, not `h2`, so that paths to the `h2` crate stay unambiguous.

pub(crate) mod budget;
mod conn;
pub(crate) mod exchange;
pub(crate) mod files;
pub(crate) mod filling;
mod frames;
pub(crate) mod from_http1;
mod gather;
mod grpc;
pub(crate) mod interim;
mod io;
pub(crate) mod local;
mod names;
mod outbox;
pub(crate) mod request;
pub(crate) mod respond;
pub(crate) mod scratch;
mod send;
mod stream;
pub(crate) mod stream_log;
#[cfg(test)]
mod test_io;
pub(crate) mod trailers;
pub(crate) mod upstream;
mod upstream_request;
mod websocket;

pub(crate) use conn::next_idle_look;
pub use conn::serve;

/// The client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection's first bytes say about the preface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preface {
    /// The whole preface is there.
    Complete,
    /// What arrived so far is the start of the preface: read more.
    Partial,
    /// Not HTTP/2 (decided on the first differing byte; `P` then anything but `R` for
    /// `POST`, `PUT`, `PATCH`).
    Not,
}

/// Classifies the first bytes of a connection.
#[inline]
pub fn preface(buf: &[u8]) -> Preface {
    if buf.first() != Some(&b'P') {
        return Preface::Not;
    }
    let n = buf.len().min(PREFACE.len());
    if buf[..n] != PREFACE[..n] {
        Preface::Not
    } else if n == PREFACE.len() {
        Preface::Complete
    } else {
        Preface::Partial
    }
}

/// Whether a connection's first line (complete in `buf`) is neither an HTTP/1 request line
/// nor the preface: three tokens, the last not starting with `HTTP/` (`INVALID CONNECTION
/// PREFACE`). Such a connection is closed without an HTTP/1.1 answer. A request line with an
/// HTTP version (or with a bad target, or bad fields) still gets its 400.
pub fn neither_protocol(buf: &[u8]) -> bool {
    let Some(end) = buf.iter().position(|b| *b == b'\n') else {
        return false;
    };
    let line = &buf[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut tokens = line.split(|b| *b == b' ');
    match (tokens.next(), tokens.next(), tokens.next(), tokens.next()) {
        (Some(_), Some(_), Some(version), None) => !version.starts_with(b"HTTP/"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_preface_split_at_every_byte() {
        for cut in 1..PREFACE.len() {
            assert_eq!(preface(&PREFACE[..cut]), Preface::Partial, "cut {cut}");
        }
        assert_eq!(preface(PREFACE), Preface::Complete);
        let mut more = PREFACE.to_vec();
        more.extend_from_slice(b"\0\0\0\x04");
        assert_eq!(preface(&more), Preface::Complete);
        for h1 in [
            &b"POST / HTTP/1.1\r\n"[..],
            b"PUT /",
            b"PATCH",
            b"GET /",
            b"PRI * HTTP/1.1",
        ] {
            assert_eq!(
                preface(h1),
                Preface::Not,
                "{:?}",
                String::from_utf8_lossy(h1)
            );
        }
    }

    #[test]
    fn tells_a_bad_preface_from_a_bad_http1_request() {
        assert!(neither_protocol(b"INVALID CONNECTION PREFACE\r\n\r\n"));
        assert!(neither_protocol(b"GET / FOO\n"));
        for h1 in [
            &b"GET / HTTP/9.9\r\n"[..],
            b"GET /a b HTTP/1.1\r\n",
            b"GET /\r\n",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            b"INVALID CONNECTION PREFACE",
        ] {
            assert!(!neither_protocol(h1), "{:?}", String::from_utf8_lossy(h1));
        }
    }
}
