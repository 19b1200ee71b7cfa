use std::io::Read;

use super::*;

fn cfg(order: &[Encoding]) -> Compression {
    Compression {
        algorithms: order.to_vec(),
        min_size: 1024,
        types: vec!["text/*".into(), "application/json".into()],
        levels: CompressionLevels::default(),
    }
}

fn choose(accept: &str, order: &[Encoding]) -> Option<Encoding> {
    let mut q = Qualities::default();
    for line in accept.split('\n') {
        q.read(line.as_bytes());
    }
    q.choose(order)
}

use Encoding::{Br, Gzip, Zstd};

#[test]
fn negotiation_follows_q_values_then_route_order() {
    let all = [Zstd, Br, Gzip];
    assert_eq!(choose("gzip, br, zstd", &all), Some(Zstd));
    assert_eq!(choose("gzip, br, zstd", &[Gzip, Br]), Some(Gzip));
    assert_eq!(choose("gzip;q=1, br;q=0.9", &all), Some(Gzip));
    assert_eq!(choose("gzip;q=0.5, br;q=0.51", &all), Some(Br));
    assert_eq!(choose("GZIP", &all), Some(Gzip));
    assert_eq!(choose("x-gzip", &all), Some(Gzip));
    assert_eq!(choose("deflate", &all), None);
    assert_eq!(choose("", &all), None);
    // Across several header lines.
    assert_eq!(choose("deflate\nbr", &all), Some(Br));
}

#[test]
fn q_zero_refuses_and_star_stands_for_the_rest() {
    let all = [Zstd, Br, Gzip];
    assert_eq!(choose("gzip;q=0", &all), None);
    assert_eq!(choose("zstd;q=0, br;q=0.0, *", &all), Some(Gzip));
    assert_eq!(choose("*", &all), Some(Zstd));
    assert_eq!(choose("*;q=0", &all), None);
    assert_eq!(choose("*;q=0, gzip", &all), Some(Gzip));
    // Malformed q values count as refusals.
    assert_eq!(choose("gzip;q=2", &all), None);
    assert_eq!(choose("gzip;q=1.5", &all), None);
    assert_eq!(choose("gzip;q=0.1234", &all), None);
    assert_eq!(choose("gzip;q=abc", &all), None);
    assert_eq!(choose("gzip ; q=0.3 ", &all), Some(Gzip));
}

#[test]
fn identity_preferred_means_no_compression() {
    let all = [Zstd, Br, Gzip];
    assert_eq!(choose("gzip;q=0.5, identity", &all), None);
    assert_eq!(choose("gzip, identity;q=0.5", &all), Some(Gzip));
    assert_eq!(choose("gzip, identity", &all), Some(Gzip));
    assert_eq!(choose("identity", &all), None);
    assert_eq!(choose("gzip;q=0.5, *;q=0.9", &all), Some(Zstd));
}

#[test]
fn q_values_parse_to_thousandths() {
    assert_eq!(parse_q(b"0"), Some(0));
    assert_eq!(parse_q(b"1"), Some(1000));
    assert_eq!(parse_q(b"1.000"), Some(1000));
    assert_eq!(parse_q(b"0.5"), Some(500));
    assert_eq!(parse_q(b"0.05"), Some(50));
    assert_eq!(parse_q(b"0.001"), Some(1));
    assert_eq!(parse_q(b"1.001"), None);
    assert_eq!(parse_q(b""), None);
    assert_eq!(parse_q(b".5"), None);
}

/// Parses `head` as a response and plans it for a client that accepted `accepted`.
fn plan_of(head: &str, is_head: bool, accepted: Option<Encoding>) -> Plan {
    let mut resp = crate::codec::http1::ResponseHead::default();
    let parsed = crate::codec::http1::parse_response(head.as_bytes(), 65536, is_head, &mut resp);
    assert!(matches!(parsed, Ok(true)), "{head}");
    let r = Response {
        status: resp.status,
        fields: Fields::Http1 {
            buf: head.as_bytes(),
            headers: &resp.headers,
        },
        framing: resp.framing,
        is_head,
        accepted,
        rules: None,
    };
    plan(&cfg(&[Zstd, Br, Gzip]), &r)
}

#[test]
fn plan_rules() {
    let ok =
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: 5000\r\n\r\n";
    let yes = Plan {
        vary: true,
        encoding: Some(Gzip),
        weak_etag: false,
    };
    let vary_only = Plan {
        vary: true,
        encoding: None,
        weak_etag: false,
    };
    assert_eq!(plan_of(ok, false, Some(Gzip)), yes);
    assert_eq!(plan_of(ok, false, None), vary_only);
    assert_eq!(plan_of(ok, true, Some(Gzip)), vary_only);
    let chunked =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(plan_of(chunked, false, Some(Gzip)), yes);
    let short = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1023\r\n\r\n";
    assert_eq!(plan_of(short, false, Some(Gzip)), vary_only);
    let none = Plan::default();
    for head in [
        "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 5000\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nContent-Length: 5000\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nCache-Control: public, no-transform\r\nContent-Length: 5000\r\n\r\n",
    ] {
        assert_eq!(plan_of(head, false, Some(Gzip)), none, "{head}");
    }
    for head in [
        "HTTP/1.1 206 Partial\r\nContent-Type: text/html\r\nContent-Range: bytes 0-4999/9000\r\nContent-Length: 5000\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Range: bytes 0-4999/9000\r\nContent-Length: 5000\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nContent-Type: text/html\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Type: text/html\r\n\r\n",
    ] {
        assert_eq!(plan_of(head, false, Some(Gzip)), vary_only, "{head}");
    }
    let varies = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nVary: Origin, accept-encoding\r\nContent-Length: 5000\r\n\r\n";
    assert_eq!(
        plan_of(varies, false, Some(Br)),
        Plan {
            vary: false,
            encoding: Some(Br),
            weak_etag: false
        }
    );
}

#[test]
fn head_edits_weaken_the_etag() {
    let head = "HTTP/1.1 200 OK\r\nETag: \"abc\"\r\nContent-Type: text/html\r\nContent-Length: 5000\r\n\r\n";
    let mut resp = crate::codec::http1::ResponseHead::default();
    crate::codec::http1::parse_response(head.as_bytes(), 65536, false, &mut resp).unwrap();
    let plan = Plan {
        vary: true,
        encoding: Some(Zstd),
        weak_etag: true,
    };
    let mut out = Vec::new();
    let fields = Fields::Http1 {
        buf: head.as_bytes(),
        headers: &resp.headers,
    };
    plan.push_lines(&mut out, fields);
    assert_eq!(
        out,
        b"Content-Encoding: zstd\r\nETag: W/\"abc\"\r\nVary: Accept-Encoding\r\n"
    );
    assert!(plan.drops(b"ETag") && plan.drops(b"content-length") && plan.drops(b"Accept-Ranges"));
    assert!(!plan.drops(b"Content-Type"));
    assert!(!Plan::default().drops(b"ETag"));
    for name in [
        "Content-Encoding",
        "content-digest",
        "Content-MD5",
        "Repr-Digest",
    ] {
        assert!(plan.drops(name.as_bytes()), "{name}");
    }
    let mut weak = Vec::new();
    push_weak(&mut weak, b"W/\"x\"");
    assert_eq!(weak, b"W/\"x\"");
}

/// Decodes `data` compressed with `encoding`.
pub(crate) fn decode(encoding: Encoding, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        Gzip => flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .map(drop),
        Br => brotli::Decompressor::new(data, 4096)
            .read_to_end(&mut out)
            .map(drop),
        Zstd => zstd::stream::read::Decoder::new(data)
            .and_then(|mut d| d.read_to_end(&mut out))
            .map(drop),
    }
    .expect("decodes");
    out
}

#[test]
fn encoders_round_trip_in_pieces() {
    let body: Vec<u8> = (0..50_000u32)
        .flat_map(|i| format!("{{\"n\":{i},\"s\":\"text\"}},").into_bytes())
        .take(100_000)
        .collect();
    for encoding in Encoding::ALL {
        for piece in [1usize, 7, 4096, 16384, body.len()] {
            let mut enc = Encoder::new(encoding, &CompressionLevels::default(), None).unwrap();
            let mut wire = Vec::new();
            for chunk in body
                .chunks(piece.max(1))
                .take(if piece == 1 { 300 } else { usize::MAX })
            {
                enc.feed(chunk).unwrap();
                wire.extend_from_slice(enc.output());
                enc.output().clear();
            }
            enc.finish().unwrap();
            wire.extend_from_slice(enc.output());
            let sent = if piece == 1 { &body[..300] } else { &body[..] };
            assert_eq!(
                decode(encoding, &wire),
                sent,
                "{encoding:?} in {piece}-byte pieces"
            );
            if piece == body.len() {
                assert!(wire.len() < body.len() / 4, "{encoding:?} compresses");
            }
        }
    }
}

#[test]
fn every_flush_makes_what_came_so_far_decodable() {
    for encoding in Encoding::ALL {
        let mut enc = Encoder::new(encoding, &CompressionLevels::default(), None).unwrap();
        enc.feed(b"data: first event\n\n").unwrap();
        let first = std::mem::take(enc.output());
        assert!(!first.is_empty(), "{encoding:?} flushed");
        // A streaming decoder gets the whole first event out of the first flush.
        let mut got = vec![0u8; 64];
        let n = match encoding {
            Gzip => flate2::read::GzDecoder::new(&first[..])
                .read(&mut got)
                .unwrap(),
            Br => brotli::Decompressor::new(&first[..], 4096)
                .read(&mut got)
                .unwrap(),
            Zstd => zstd::stream::read::Decoder::new(&first[..])
                .unwrap()
                .read(&mut got)
                .unwrap(),
        };
        assert_eq!(&got[..n], b"data: first event\n\n", "{encoding:?}");
    }
}

#[test]
fn type_patterns() {
    let c = cfg(&[Gzip]);
    assert!(c.compresses_type(b"text/html"));
    assert!(c.compresses_type(b"Text/Plain; charset=utf-8"));
    assert!(c.compresses_type(b"application/json"));
    assert!(!c.compresses_type(b"application/json-seq"));
    assert!(!c.compresses_type(b"text/"));
    assert!(!c.compresses_type(b"image/png"));
    let any = Compression {
        types: vec!["*/*".into()],
        ..cfg(&[Gzip])
    };
    assert!(any.compresses_type(b"image/png"));
    assert!(any.compresses_type(b"text/html; charset=utf-8"));
    assert!(!any.compresses_type(b""));
    // gRPC is never compressed: its clients would not undo a Content-Encoding.
    assert!(!any.compresses_type(b"application/grpc"));
    assert!(!any.compresses_type(b"Application/GRPC+proto"));
    assert!(any.compresses_type(b"application/grpc-web-text"));
}

/// The zstd context of a stream at the highest allowed level, after 1 MiB of
/// incompressible-ish input with no pledged size, stays under 7 MiB (measured 5.8 MiB;
/// 82 MiB without the table caps).
#[test]
fn zstd_stream_memory_is_bounded_at_the_highest_level() {
    use zstd::zstd_safe::{zstd_sys::ZSTD_EndDirective, CCtx, InBuffer, OutBuffer};
    let mut cctx = CCtx::create();
    for p in zstd_params(19) {
        cctx.set_parameter(p).unwrap();
    }
    let mut state = 0x9e37_79b9_u32;
    let input: Vec<u8> = (0..1 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            b'a' + (state % 16) as u8
        })
        .collect();
    let mut out = vec![0u8; 1 << 21];
    let mut src = InBuffer::around(&input);
    let mut dst = OutBuffer::around(&mut out[..]);
    cctx.compress_stream2(&mut dst, &mut src, ZSTD_EndDirective::ZSTD_e_flush)
        .unwrap();
    let size = cctx.sizeof();
    assert!(size < 7 << 20, "zstd context is {size} bytes");
}

/// Plans `head` for a gzip client on a route whose `response_headers` drop `dropped`.
fn plan_with_rules(head: &str, dropped: &[&str]) -> Plan {
    let mut resp = crate::codec::http1::ResponseHead::default();
    crate::codec::http1::parse_response(head.as_bytes(), 65536, false, &mut resp).unwrap();
    let rules = weir_config::HeaderRules {
        drop: dropped.iter().map(|d| (*d).to_owned()).collect(),
        ..Default::default()
    };
    let r = Response {
        status: resp.status,
        fields: Fields::Http1 {
            buf: head.as_bytes(),
            headers: &resp.headers,
        },
        framing: resp.framing,
        is_head: false,
        accepted: Some(Gzip),
        rules: Some(&rules),
    };
    plan(&cfg(&[Gzip]), &r)
}

#[test]
fn fields_the_route_drops_count_as_absent() {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nVary: Accept-Encoding\r\nETag: \"e\"\r\nContent-Length: 5000\r\n\r\n";
    let kept = plan_with_rules(head, &[]);
    assert!(!kept.vary && kept.weak_etag);
    let dropped = plan_with_rules(head, &["vary", "etag"]);
    assert!(dropped.vary && !dropped.weak_etag);
    assert_eq!(dropped.encoding, Some(Gzip));
}

#[test]
fn a_304_weakens_the_etag_when_the_200_would_be_compressed() {
    for head in [
        "HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Type: text/html\r\nETag: \"e\"\r\n\r\n",
    ] {
        let p = plan_of(head, false, Some(Gzip));
        assert!(
            p.weak_etag && p.encoding.is_none() && p.drops(b"ETag"),
            "{head}"
        );
        assert!(!plan_of(head, false, None).weak_etag, "{head}");
    }
    let image = "HTTP/1.1 304 Not Modified\r\nContent-Type: image/png\r\nETag: \"e\"\r\n\r\n";
    assert!(!plan_of(image, false, Some(Gzip)).weak_etag);
}
