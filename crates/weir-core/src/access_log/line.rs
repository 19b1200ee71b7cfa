//! Formatting one access-log line (common, combined, JSON) into a worker's buffer.

use std::time::Duration;

use weir_config::AccessLogFormat;

use super::time::TimeCache;
use crate::codec::http1::write::push_decimal;
use crate::codec::http1::RequestHead;
use crate::metrics::AbortReason;

/// What the request contributed, copied before its head buffer is reused.
#[derive(Debug, Default)]
pub struct RequestFields {
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub http10: bool,
    /// The request came on an HTTP/2 stream (logged as `HTTP/2.0`).
    pub http2: bool,
    /// The request came on an HTTP/3 stream (logged as `HTTP/3`).
    pub http3: bool,
    pub referer: Vec<u8>,
    pub user_agent: Vec<u8>,
}

impl RequestFields {
    /// Empties the fields, keeping their buffers.
    pub fn clear(&mut self) {
        self.method.clear();
        self.target.clear();
        self.http10 = false;
        self.http2 = false;
        self.http3 = false;
        self.referer.clear();
        self.user_agent.clear();
    }

    /// Copies what the access log needs from a request head parsed from `buf`, before the
    /// head is consumed. `http2` is left for the caller to set.
    pub fn capture(&mut self, buf: &[u8], head: &RequestHead) {
        self.method.clear();
        self.method.extend_from_slice(&buf[head.method.clone()]);
        self.target.clear();
        if let Some(authority) = &head.target_authority {
            self.target.extend_from_slice(b"http://");
            self.target.extend_from_slice(&buf[authority.clone()]);
        }
        self.target.extend_from_slice(head.path(buf));
        self.http10 = head.minor_version == 0;
        self.referer.clear();
        self.user_agent.clear();
        for h in &head.headers {
            let name = &buf[h.name.clone()];
            if name.eq_ignore_ascii_case(b"referer") {
                self.referer.extend_from_slice(&buf[h.value.clone()]);
            } else if name.eq_ignore_ascii_case(b"user-agent") {
                self.user_agent.extend_from_slice(&buf[h.value.clone()]);
            }
        }
    }
}

/// Everything known once the response is done.
pub struct Outcome<'a> {
    pub client: &'a [u8],
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration: Duration,
    pub route: &'a str,
    pub upstream: Option<&'a str>,
    pub upstream_time: Option<Duration>,
    /// The response was cut short after its head (`status` is that head's).
    pub aborted: Option<AbortReason>,
    /// The connection's TLS session (JSON lines of TLS listeners gain its fields).
    pub tls: Option<&'a crate::tls::session::TlsSession>,
    /// The request's id (JSON only; empty: the listener has `request_id = false`).
    pub request_id: &'a [u8],
    /// The `grpc-status` the client got (JSON only; `None`: not a gRPC request, or it got
    /// none, such as a stream reset).
    pub grpc_status: Option<u32>,
    /// The request's trace and server span ids (JSON only; `None`: not sampled).
    pub trace: Option<(&'a [u8; 16], &'a [u8; 8])>,
    /// What a route's cache did (JSON only; `None`: the route has no cache, or it did not
    /// serve this method).
    pub cache: Option<crate::cache::CacheResult>,
}

pub fn push_line(
    out: &mut Vec<u8>,
    format: AccessLogFormat,
    req: &RequestFields,
    o: &Outcome<'_>,
    time: &mut TimeCache,
) {
    match format {
        AccessLogFormat::Json => push_json(out, req, o, time),
        AccessLogFormat::Common | AccessLogFormat::Combined => {
            push_common(out, req, o, time);
            if format == AccessLogFormat::Combined {
                out.extend_from_slice(b" \"");
                push_escaped(out, or_dash(&req.referer), false);
                out.extend_from_slice(b"\" \"");
                push_escaped(out, or_dash(&req.user_agent), false);
                out.push(b'"');
            }
        }
    }
    out.push(b'\n');
}

fn or_dash(v: &[u8]) -> &[u8] {
    if v.is_empty() {
        b"-"
    } else {
        v
    }
}

fn protocol(req: &RequestFields) -> &'static [u8] {
    if req.http2 {
        b"HTTP/2.0"
    } else if req.http3 {
        b"HTTP/3"
    } else if req.http10 {
        b"HTTP/1.0"
    } else {
        b"HTTP/1.1"
    }
}

fn push_common(out: &mut Vec<u8>, req: &RequestFields, o: &Outcome<'_>, time: &mut TimeCache) {
    out.extend_from_slice(o.client);
    out.extend_from_slice(b" - - [");
    out.extend_from_slice(time.now().0.as_bytes());
    out.extend_from_slice(b"] \"");
    push_escaped(out, &req.method, false);
    out.push(b' ');
    push_escaped(out, &req.target, false);
    out.push(b' ');
    out.extend_from_slice(protocol(req));
    out.extend_from_slice(b"\" ");
    push_decimal(out, u64::from(o.status));
    out.push(b' ');
    push_decimal(out, o.bytes_out);
}

fn push_json(out: &mut Vec<u8>, req: &RequestFields, o: &Outcome<'_>, time: &mut TimeCache) {
    let (_, iso, millis) = time.now();
    // Each key is part of one literal with its punctuation: a constant-length copy the
    // compiler inlines, instead of three calls per field.
    out.extend_from_slice(b"{\"time\":\"");
    out.extend_from_slice(iso.as_bytes());
    out.push(b'.');
    push_digits::<3>(out, u64::from(millis));
    out.extend_from_slice(b"Z\",\"client\":\"");
    push_escaped(out, o.client, true);
    out.extend_from_slice(b"\",\"method\":\"");
    push_escaped(out, &req.method, true);
    out.extend_from_slice(b"\",\"target\":\"");
    push_escaped(out, &req.target, true);
    out.extend_from_slice(b"\",\"protocol\":\"");
    out.extend_from_slice(protocol(req));
    out.extend_from_slice(b"\",\"status\":");
    push_decimal(out, u64::from(o.status));
    match o.aborted {
        Some(reason) => {
            out.extend_from_slice(b",\"aborted\":\"");
            out.extend_from_slice(reason.label().as_bytes());
            out.push(b'"');
        }
        None => out.extend_from_slice(b",\"aborted\":null"),
    }
    match o.grpc_status {
        Some(code) => {
            out.extend_from_slice(b",\"grpc_status\":");
            push_decimal(out, u64::from(code));
        }
        None => out.extend_from_slice(b",\"grpc_status\":null"),
    }
    out.extend_from_slice(b",\"bytes_in\":");
    push_decimal(out, o.bytes_in);
    out.extend_from_slice(b",\"bytes_out\":");
    push_decimal(out, o.bytes_out);
    out.extend_from_slice(b",\"duration\":");
    push_seconds(out, o.duration);
    push_json_route(out, o);
    if o.request_id.is_empty() {
        out.extend_from_slice(b",\"request_id\":null");
    } else {
        out.extend_from_slice(b",\"request_id\":\"");
        push_escaped(out, o.request_id, true);
        out.push(b'"');
    }
    if let Some((trace_id, span_id)) = o.trace {
        out.extend_from_slice(b",\"trace_id\":\"");
        crate::otel::push_hex(out, trace_id);
        out.extend_from_slice(b"\",\"span_id\":\"");
        crate::otel::push_hex(out, span_id);
        out.push(b'"');
    }
    out.extend_from_slice(b",\"referer\":\"");
    push_escaped(out, &req.referer, true);
    out.extend_from_slice(b"\",\"user_agent\":\"");
    push_escaped(out, &req.user_agent, true);
    out.push(b'"');
    if let Some(tls) = o.tls {
        push_json_tls(out, tls);
    }
    out.push(b'}');
}

/// `,"route":..,"upstream":..,"upstream_time":..,"cache":..`: where the request went.
fn push_json_route(out: &mut Vec<u8>, o: &Outcome<'_>) {
    out.extend_from_slice(b",\"route\":\"");
    push_escaped(out, o.route.as_bytes(), true);
    match o.upstream {
        Some(u) => {
            out.extend_from_slice(b"\",\"upstream\":\"");
            push_escaped(out, u.as_bytes(), true);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"\",\"upstream\":null"),
    }
    match o.upstream_time {
        Some(t) => {
            out.extend_from_slice(b",\"upstream_time\":");
            push_seconds(out, t);
        }
        None => out.extend_from_slice(b",\"upstream_time\":null"),
    }
    match o.cache {
        Some(result) => {
            out.extend_from_slice(b",\"cache\":\"");
            out.extend_from_slice(result.label().as_bytes());
            out.push(b'"');
        }
        None => out.extend_from_slice(b",\"cache\":null"),
    }
}

/// `,"tls_version":..,"tls_cipher":..,"sni":..,"client_cert_subject":..` (null when absent).
fn push_json_tls(out: &mut Vec<u8>, tls: &crate::tls::session::TlsSession) {
    out.extend_from_slice(b",\"tls_version\":\"");
    out.extend_from_slice(tls.version.as_bytes());
    out.extend_from_slice(b"\",\"tls_cipher\":\"");
    out.extend_from_slice(tls.cipher.as_bytes());
    out.push(b'"');
    for (key, value) in [
        (&b",\"sni\":"[..], tls.sni.as_deref()),
        (
            b",\"client_cert_subject\":",
            tls.client_cert_subject.as_deref(),
        ),
    ] {
        out.extend_from_slice(key);
        match value {
            Some(v) => {
                out.push(b'"');
                push_escaped(out, v.as_bytes(), true);
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// Seconds with six decimals (microseconds, rounded), without allocating.
fn push_seconds(out: &mut Vec<u8>, d: Duration) {
    let micros = (d.as_nanos() + 500) / 1000;
    push_decimal(out, (micros / 1_000_000) as u64);
    out.push(b'.');
    push_digits::<6>(out, (micros % 1_000_000) as u64);
}

/// The last `W` decimal digits of `n`, with leading zeros: one fixed-size copy.
#[inline]
fn push_digits<const W: usize>(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [b'0'; W];
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&digits);
}

/// How many leading bytes of `value` need no escape. Eight bytes at a time: a word holds a
/// byte to escape when a byte is below 0x20 or above 0x7e, or equals `"` or `\\` (the
/// classic SWAR has-less / has-more / has-zero tests, which are exact for "any byte").
fn safe_prefix(value: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let needs_escape = |w: u64| {
        let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        // Adding 1 to each byte sets its high bit from 0x7f up (bytes with it set already
        // are caught by `| w`; their carries cannot clear another byte's high bit).
        let above_tilde = (w.wrapping_add(ONES) | w) & HIGH;
        below_space
            | above_tilde
            | has_zero(w ^ (ONES * u64::from(b'"')))
            | has_zero(w ^ (ONES * u64::from(b'\\')))
            != 0
    };
    let mut at = 0;
    while let Some(word) = value.get(at..at + 8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        if needs_escape(u64::from_le_bytes(bytes)) {
            break;
        }
        at += 8;
    }
    at + value[at..]
        .iter()
        .position(|b| !is_safe(*b))
        .unwrap_or(value.len() - at)
}

/// A byte that goes into a log line as it is.
#[inline]
fn is_safe(b: u8) -> bool {
    matches!(b, 0x20..=0x7e) && b != b'"' && b != b'\\'
}

/// Escapes quotes, backslashes and non-printable bytes: `\u00XX` in JSON, `\xXX` otherwise
/// (as nginx does), so a request can never forge a log line.
fn push_escaped(out: &mut Vec<u8>, value: &[u8], json: bool) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut rest = value;
    // Copy runs of bytes that need no escape in one go (usually the whole value).
    while !rest.is_empty() {
        let run = safe_prefix(rest);
        out.extend_from_slice(&rest[..run]);
        let Some((&b, tail)) = rest[run..].split_first() else {
            break;
        };
        rest = tail;
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            _ if json => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]),
            _ => out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (RequestFields, Outcome<'static>) {
        let req = RequestFields {
            method: b"GET".to_vec(),
            target: b"/a?\"x\"".to_vec(),
            http10: false,
            http2: false,
            http3: false,
            referer: Vec::new(),
            user_agent: b"curl/8\n".to_vec(),
        };
        let o = Outcome {
            client: b"127.0.0.1",
            status: 200,
            bytes_in: 80,
            bytes_out: 615,
            duration: Duration::from_micros(1500),
            route: "all",
            upstream: Some("127.0.0.1:9000"),
            upstream_time: Some(Duration::from_micros(1000)),
            aborted: None,
            tls: None,
            request_id: b"abc-1",
            grpc_status: None,
            trace: None,
            cache: None,
        };
        (req, o)
    }

    #[test]
    fn combined_line() {
        let (req, o) = sample();
        let mut out = Vec::new();
        push_line(
            &mut out,
            AccessLogFormat::Combined,
            &req,
            &o,
            &mut TimeCache::default(),
        );
        let line = String::from_utf8(out).unwrap();
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(
            line.ends_with("] \"GET /a?\\\"x\\\" HTTP/1.1\" 200 615 \"-\" \"curl/8\\x0a\"\n"),
            "{line}"
        );
    }

    #[test]
    fn http2_requests_show_http_2_0() {
        let (mut req, o) = sample();
        req.http2 = true;
        for (format, want) in [
            (
                AccessLogFormat::Common,
                "\"GET /a?\\\"x\\\" HTTP/2.0\" 200 615",
            ),
            (
                AccessLogFormat::Combined,
                "\"GET /a?\\\"x\\\" HTTP/2.0\" 200 615",
            ),
            (AccessLogFormat::Json, "\"protocol\":\"HTTP/2.0\""),
        ] {
            let mut out = Vec::new();
            push_line(&mut out, format, &req, &o, &mut TimeCache::default());
            let line = String::from_utf8(out).unwrap_or_default();
            assert!(line.contains(want), "{format:?}: {line}");
        }
    }

    #[test]
    fn json_line_is_one_line_with_all_fields() {
        let (req, o) = sample();
        let mut out = Vec::new();
        push_line(
            &mut out,
            AccessLogFormat::Json,
            &req,
            &o,
            &mut TimeCache::default(),
        );
        let line = String::from_utf8(out).unwrap();
        assert_eq!(line.matches('\n').count(), 1);
        assert!(
            line.starts_with("{\"time\":\"") && line.contains("Z\",\"client\""),
            "{line}"
        );
        for field in [
            "\"status\":200,\"aborted\":null,",
            "\"bytes_out\":615",
            "\"route\":\"all\"",
            "\"upstream\":\"127.0.0.1:9000\"",
            "\"duration\":0.001500",
            "\"request_id\":\"abc-1\"",
            "\"user_agent\":\"curl/8\\u000a\"",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
    }

    #[test]
    fn json_grpc_status_is_a_number_or_null() {
        let (req, mut o) = sample();
        assert!(json_line(&req, &o).contains(",\"aborted\":null,\"grpc_status\":null,"));
        o.grpc_status = Some(14);
        assert!(json_line(&req, &o).contains(",\"grpc_status\":14,\"bytes_in\":"));
    }

    fn json_line(req: &RequestFields, o: &Outcome<'_>) -> String {
        let mut out = Vec::new();
        push_line(
            &mut out,
            AccessLogFormat::Json,
            req,
            o,
            &mut TimeCache::default(),
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_line_of_a_tls_connection_has_its_fields() {
        let (req, mut o) = sample();
        let tls = crate::tls::session::TlsSession {
            version: "TLSv1.3",
            cipher: "TLS13_AES_128_GCM_SHA256",
            sni: Some("a.example.com".into()),
            client_cert_subject: Some("CN=\"x\"".into()),
            ..Default::default()
        };
        o.tls = Some(&tls);
        let line = json_line(&req, &o);
        assert!(
            line.ends_with(
                "\"user_agent\":\"curl/8\\u000a\",\"tls_version\":\"TLSv1.3\",\
                 \"tls_cipher\":\"TLS13_AES_128_GCM_SHA256\",\"sni\":\"a.example.com\",\
                 \"client_cert_subject\":\"CN=\\\"x\\\"\"}\n"
            ),
            "{line}"
        );
        let no_sni = crate::tls::session::TlsSession::default();
        o.tls = Some(&no_sni);
        let line = json_line(&req, &o);
        assert!(
            line.ends_with("\"sni\":null,\"client_cert_subject\":null}\n"),
            "{line}"
        );
    }

    #[test]
    fn an_aborted_response_says_why_in_json_only() {
        let (req, mut o) = sample();
        o.aborted = Some(AbortReason::UpstreamClosed);
        let line = |format| {
            let mut out = Vec::new();
            push_line(&mut out, format, &req, &o, &mut TimeCache::default());
            String::from_utf8(out).unwrap()
        };
        let json = line(AccessLogFormat::Json);
        assert!(
            json.contains(",\"status\":200,\"aborted\":\"upstream_closed\","),
            "{json}"
        );
        // Common and combined keep their standard fields.
        let combined = line(AccessLogFormat::Combined);
        assert!(!combined.contains("aborted") && !combined.contains("upstream_closed"));
        assert!(combined.contains("\" 200 615 \""), "{combined}");
    }

    #[test]
    fn escapes_only_what_needs_it_wherever_it_is() {
        let cases: [(&[u8], &str, &str); 5] = [
            (b"plain/path?q=1", "plain/path?q=1", "plain/path?q=1"),
            (b"\"x\"", "\\\"x\\\"", "\\\"x\\\""),
            (b"a\\b\x01", "a\\\\b\\u0001", "a\\\\b\\x01"),
            (b"\xffend", "\\u00ffend", "\\xffend"),
            (b"", "", ""),
        ];
        for (raw, json, common) in cases {
            let mut out = Vec::new();
            push_escaped(&mut out, raw, true);
            assert_eq!(String::from_utf8(out).unwrap(), json, "{raw:?}");
            let mut out = Vec::new();
            push_escaped(&mut out, raw, false);
            assert_eq!(String::from_utf8(out).unwrap(), common, "{raw:?}");
        }
    }

    #[test]
    fn seconds_have_six_rounded_decimals() {
        let cases = [
            (Duration::ZERO, "0.000000"),
            (Duration::from_nanos(1_898_400), "0.001898"),
            (Duration::from_nanos(1_898_500), "0.001899"),
            (Duration::from_micros(12_345_678), "12.345678"),
            (Duration::from_nanos(999_999_600), "1.000000"),
        ];
        for (d, want) in cases {
            let mut out = Vec::new();
            push_seconds(&mut out, d);
            assert_eq!(String::from_utf8(out).unwrap(), want, "{d:?}");
        }
        let mut out = b"x".to_vec();
        push_digits::<3>(&mut out, 7);
        push_digits::<3>(&mut out, 0);
        push_digits::<3>(&mut out, 999);
        push_digits::<6>(&mut out, 42);
        assert_eq!(out, b"x007000999000042");
    }

    #[test]
    fn the_word_scan_finds_every_byte_to_escape_at_every_position() {
        for b in 0..=255u8 {
            for len in 1..=20 {
                for at in 0..len {
                    let mut value = vec![b'a'; len];
                    value[at] = b;
                    let want = if is_safe(b) { len } else { at };
                    assert_eq!(safe_prefix(&value), want, "byte {b:#x} at {at} of {len}");
                }
            }
        }
    }
}
