//! Formatting one access-log line (common, combined, JSON) into a worker's buffer.

use std::time::Duration;

use weir_config::AccessLogFormat;

use super::time::TimeCache;
use crate::codec::http1::write::push_decimal;

/// What the request contributed, copied before its head buffer is reused.
#[derive(Debug, Default)]
pub struct RequestFields {
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub http10: bool,
    pub referer: Vec<u8>,
    pub user_agent: Vec<u8>,
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
    /// The request's id (JSON only; empty: the listener has `request_id = false`).
    pub request_id: &'a [u8],
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
    if req.http10 {
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
    out.extend_from_slice(b",\"bytes_in\":");
    push_decimal(out, o.bytes_in);
    out.extend_from_slice(b",\"bytes_out\":");
    push_decimal(out, o.bytes_out);
    out.extend_from_slice(b",\"duration\":");
    push_seconds(out, o.duration);
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
    if o.request_id.is_empty() {
        out.extend_from_slice(b",\"request_id\":null");
    } else {
        out.extend_from_slice(b",\"request_id\":\"");
        push_escaped(out, o.request_id, true);
        out.push(b'"');
    }
    out.extend_from_slice(b",\"referer\":\"");
    push_escaped(out, &req.referer, true);
    out.extend_from_slice(b"\",\"user_agent\":\"");
    push_escaped(out, &req.user_agent, true);
    out.extend_from_slice(b"\"}");
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
            request_id: b"abc-1",
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
            "\"status\":200",
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
