//! Response compression (`compression = { ... }` on a route): which coding a client gets
//! (`negotiate`, from the request's `Accept-Encoding`), whether a response is compressed
//! (`plan`, from its status and head), the head edits that go with it, and the streaming
//! `Encoder` the body loops feed one upstream read at a time.
//!
//! Everything here runs only on routes with `compression`: the others pay one `Option`
//! check per request.

use std::io::{self, Write};

use weir_config::{Compression, CompressionLevels, Encoding, HeaderRules};

use crate::codec::http1::{BodyFraming, HeaderSpan};
use crate::codec::Fields;

/// Window of the brotli and zstd encoders (2^18 = 256 KiB).
const WINDOW_LOG: u32 = 18;

/// Largest zstd hash and chain tables (2^19 entries of 4 bytes): zstd sizes them from the
/// level alone when the body's length is unknown (2^25 at level 19, about 80 MiB a
/// stream); capped, a stream's encoder stays near 6 MiB at level 19 (measured).
const ZSTD_TABLE_LOG: u32 = WINDOW_LOG + 1;

/// The zstd parameters of a stream at `level`: the window and the capped tables.
fn zstd_params(level: i32) -> [zstd::zstd_safe::CParameter; 4] {
    use zstd::zstd_safe::CParameter::{ChainLog, CompressionLevel, HashLog, WindowLog};
    [
        CompressionLevel(level),
        WindowLog(WINDOW_LOG),
        HashLog(ZSTD_TABLE_LOG),
        ChainLog(ZSTD_TABLE_LOG),
    ]
}

/// The coding the client prefers among the route's `algorithms`, from every
/// `Accept-Encoding` line of a request head (`buf`, `headers`). `None`: send identity
/// (no header, every coding refused with q=0, or identity preferred). Ties between codings
/// go to the route's order; a coding tied with identity wins (the client accepts both).
pub fn negotiate(cfg: &Compression, buf: &[u8], headers: &[HeaderSpan]) -> Option<Encoding> {
    negotiate_among(&cfg.algorithms, buf, headers)
}

/// As [`negotiate`], among the codings `order` (in the route's order of preference).
pub fn negotiate_among(order: &[Encoding], buf: &[u8], headers: &[HeaderSpan]) -> Option<Encoding> {
    let mut q = Qualities::default();
    for h in headers {
        if h.name.len() == 15 && buf[h.name.clone()].eq_ignore_ascii_case(b"accept-encoding") {
            q.read(&buf[h.value.clone()]);
        }
    }
    q.choose(order)
}

/// The q-values (in thousandths) a client gave each coding Weir knows, `*` and identity.
#[derive(Default)]
struct Qualities {
    codings: [Option<u16>; 3],
    star: Option<u16>,
    identity: Option<u16>,
}

impl Qualities {
    /// Reads one `Accept-Encoding` value: `coding[;q=x], ...`. An entry with a malformed q
    /// counts as refused (q=0), the safe reading.
    fn read(&mut self, value: &[u8]) {
        for entry in value.split(|b| *b == b',') {
            let mut parts = entry.split(|b| *b == b';');
            let coding = parts.next().unwrap_or_default().trim_ascii();
            if coding.is_empty() {
                continue;
            }
            let mut q = 1000;
            for param in parts {
                let param = param.trim_ascii();
                if let Some(v) = param.strip_prefix(b"q=").or(param.strip_prefix(b"Q=")) {
                    q = parse_q(v).unwrap_or(0);
                }
            }
            let slot = if coding == b"*" {
                &mut self.star
            } else if coding.eq_ignore_ascii_case(b"identity") {
                &mut self.identity
            } else if coding.eq_ignore_ascii_case(b"x-gzip") {
                &mut self.codings[Encoding::Gzip.index()]
            } else {
                match Encoding::ALL
                    .iter()
                    .find(|e| coding.eq_ignore_ascii_case(e.token().as_bytes()))
                {
                    Some(e) => &mut self.codings[e.index()],
                    None => continue,
                }
            };
            // A coding listed twice keeps its highest q.
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
    }

    fn choose(&self, order: &[Encoding]) -> Option<Encoding> {
        let mut best: Option<(Encoding, u16)> = None;
        for &e in order {
            let q = self.codings[e.index()].or(self.star).unwrap_or(0);
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((e, q));
            }
        }
        let (encoding, q) = best?;
        // Identity wins only when the client rates it above every coding it accepts
        // (named, or through `*`); unrated, it is the fallback, not a preference.
        let identity = self.identity.or(self.star).unwrap_or(0);
        (q >= identity).then_some(encoding)
    }
}

/// `0`, `0.5`, `1`, `1.000`: a qvalue of RFC 9110 12.4.2, in thousandths.
fn parse_q(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|b| *b == b'.') {
        Some(dot) => (&v[..dot], &v[dot + 1..]),
        None => (v, &[][..]),
    };
    if int.len() != 1 || frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut milli = 0u16;
    for i in 0..3 {
        milli = milli * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int[0] {
        b'0' => Some(milli),
        b'1' if milli == 0 => Some(1000),
        _ => None,
    }
}

/// What a route's compression does to one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plan {
    /// Add `Vary: Accept-Encoding` (the route compresses this type; the upstream's Vary
    /// does not cover it yet).
    pub vary: bool,
    /// Compress the body with this coding.
    pub encoding: Option<Encoding>,
    /// Send the upstream's ETag weakened (a compressed body, or a 304 answering a request
    /// whose 200 would be compressed).
    pub weak_etag: bool,
}

/// The response facts `plan` looks at, read from its head.
#[derive(Default)]
struct Facts<'a> {
    content_type: Option<&'a [u8]>,
    encoded: bool,
    ranged: bool,
    no_transform: bool,
    varies: bool,
    etag: bool,
}

impl<'a> Facts<'a> {
    /// The facts of an upstream head; a field the route's `rules` drop (`set` or `remove`)
    /// does not reach the client, so its Vary and ETag count as absent.
    fn of(fields: Fields<'a>, rules: Option<&HeaderRules>) -> Facts<'a> {
        let mut f = Facts::default();
        fields.each(|name, value| {
            let dropped = || rules.is_some_and(|r| r.drops(name));
            if name.eq_ignore_ascii_case(b"content-type") {
                f.content_type = Some(value);
            } else if name.eq_ignore_ascii_case(b"content-encoding") {
                f.encoded |= !value.trim_ascii().eq_ignore_ascii_case(b"identity");
            } else if name.eq_ignore_ascii_case(b"content-range") {
                f.ranged = true;
            } else if name.eq_ignore_ascii_case(b"cache-control") {
                f.no_transform |= list_has(value, b"no-transform");
            } else if name.eq_ignore_ascii_case(b"vary") && !dropped() {
                f.varies |= list_has(value, b"accept-encoding") || list_has(value, b"*");
            } else if name.eq_ignore_ascii_case(b"etag") && !dropped() {
                f.etag = true;
            }
        });
        f
    }
}

/// Whether a comma-separated header value has `item` (ignoring case and parameters).
fn list_has(value: &[u8], item: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|v| {
        let v = v.split(|b| *b == b'=').next().unwrap_or_default();
        v.trim_ascii().eq_ignore_ascii_case(item)
    })
}

/// The response being planned: its status, head and framing, and the request it answers.
pub struct Response<'a> {
    pub status: u16,
    pub fields: Fields<'a>,
    /// How its body is framed (an HTTP/2 body: `Length` with a `content-length`, `None`
    /// when its HEADERS ended the stream, else `Chunked`).
    pub framing: BodyFraming,
    pub is_head: bool,
    /// The coding `negotiate` chose for the request (`None`: identity).
    pub accepted: Option<Encoding>,
    /// The route's `response_headers`, applied to the same head.
    pub rules: Option<&'a HeaderRules>,
}

/// What the route's `cfg` does to `r`. Never compressed: a response already encoded,
/// a range (206 or Content-Range), 1xx/204/304, a HEAD answer, a type not listed, a body
/// known to be shorter than `min_size`, `Cache-Control: no-transform`.
pub fn plan(cfg: &Compression, r: &Response<'_>) -> Plan {
    let f = Facts::of(r.fields, r.rules);
    // A 304 often has no Content-Type: its ETag is weakened as the 200's would be
    // (weakening one the 200 kept strong costs only strong comparison).
    if r.status == 304 && f.content_type.is_none() {
        let weak_etag = f.etag && !f.encoded && !f.no_transform && r.accepted.is_some();
        return Plan {
            weak_etag,
            ..Plan::default()
        };
    }
    let compressible =
        !f.encoded && !f.no_transform && f.content_type.is_some_and(|t| cfg.compresses_type(t));
    if !compressible {
        return Plan::default();
    }
    let bodiless = r.is_head || r.status < 200 || matches!(r.status, 204 | 304);
    let short = match r.framing {
        // An empty body stays empty (an HTTP/2 stream would end before any coded byte).
        BodyFraming::Length(n) => n == 0 || n < cfg.min_size,
        BodyFraming::None => true,
        _ => false,
    };
    let encoding = r
        .accepted
        .filter(|_| !bodiless && !short && !f.ranged && r.status != 206);
    let revalidated = r.status == 304 && r.accepted.is_some();
    Plan {
        vary: !f.varies,
        encoding,
        weak_etag: f.etag && (encoding.is_some() || revalidated),
    }
}

impl Plan {
    /// Whether the plan leaves any upstream header line out.
    pub fn drops_any(&self) -> bool {
        self.encoding.is_some() || self.weak_etag
    }

    /// Whether an upstream header line is left out of the client's head because of this
    /// plan: the length, digests, range support and `Content-Encoding: identity` of the
    /// uncompressed body, and the ETag sent weakened.
    pub fn drops(&self, name: &[u8]) -> bool {
        const UNCODED: [&[u8]; 6] = [
            b"content-length",
            b"accept-ranges",
            b"content-encoding",
            b"content-digest",
            b"content-md5",
            b"repr-digest",
        ];
        (self.weak_etag && name.eq_ignore_ascii_case(b"etag"))
            || (self.encoding.is_some() && UNCODED.iter().any(|n| name.eq_ignore_ascii_case(n)))
    }

    /// Appends the plan's header lines: `Content-Encoding`, `Vary`, and the upstream's
    /// ETag made weak (the compressed bytes differ, the representation does not), as
    /// nginx does.
    pub fn push_lines(&self, out: &mut Vec<u8>, fields: Fields<'_>) {
        if let Some(e) = self.encoding {
            out.extend_from_slice(b"Content-Encoding: ");
            out.extend_from_slice(e.token().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(etag) = fields.get(b"etag").filter(|_| self.weak_etag) {
            out.extend_from_slice(b"ETag: ");
            push_weak(out, etag);
            out.extend_from_slice(b"\r\n");
        }
        if self.vary {
            out.extend_from_slice(b"Vary: Accept-Encoding\r\n");
        }
    }
}

/// Appends `etag` as a weak validator (`W/` prefixed unless it is weak already).
pub fn push_weak(out: &mut Vec<u8>, etag: &[u8]) {
    if !etag.starts_with(b"W/") {
        out.extend_from_slice(b"W/");
    }
    out.extend_from_slice(etag);
}

/// What one compressed response moved: its coding, body bytes in and compressed bytes
/// out (the route's `weir_compression_bytes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressed {
    pub encoding: Encoding,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// A streaming encoder writing into its own buffer, drained after each `feed`.
pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    /// Brotli finishes only by giving its writer back: `done` holds the output then.
    Br {
        writer: Option<Box<brotli::CompressorWriter<Vec<u8>>>>,
        done: Vec<u8>,
    },
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    /// `length`: the body's Content-Length when known (pledged to zstd, which then sizes
    /// its tables to the body).
    pub fn new(
        encoding: Encoding,
        levels: &CompressionLevels,
        length: Option<u64>,
    ) -> io::Result<Encoder> {
        let out = Vec::new();
        Ok(match encoding {
            Encoding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::new(levels.gzip),
            )),
            Encoding::Br => Encoder::Br {
                writer: Some(Box::new(brotli::CompressorWriter::new(
                    out, 4096, levels.br, WINDOW_LOG,
                ))),
                done: Vec::new(),
            },
            Encoding::Zstd => {
                let mut z = zstd::stream::write::Encoder::new(out, levels.zstd)?;
                for p in zstd_params(levels.zstd) {
                    z.set_parameter(p)?;
                }
                z.set_pledged_src_size(length)?;
                Encoder::Zstd(z)
            }
        })
    }

    /// Compresses `data` and flushes (so what arrived so far reaches the client: server
    /// sent events and long polls are not held back); the compressed bytes are in
    /// `output()` until `clear_output`.
    pub fn feed(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                e.flush()
            }
            Encoder::Br { writer, .. } => {
                let e = writer.as_mut().ok_or(io::ErrorKind::BrokenPipe)?;
                e.write_all(data)?;
                e.flush()
            }
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                e.flush()
            }
        }
    }

    /// Ends the stream: the last compressed bytes are in `output()`.
    pub fn finish(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.try_finish(),
            Encoder::Br { writer, done } => {
                if let Some(e) = writer.take() {
                    *done = e.into_inner();
                }
                Ok(())
            }
            Encoder::Zstd(e) => e.do_finish(),
        }
    }

    pub fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Br { writer, done } => match writer {
                Some(e) => e.get_mut(),
                None => done,
            },
            Encoder::Zstd(e) => e.get_mut(),
        }
    }
}

#[cfg(test)]
mod tests;
