//! Test support for response compression: an upstream that writes a chosen raw response
//! in chosen pieces (and can hold the rest back until the test says so), decoders for
//! each coding, and an incremental reader of a chunked gzip stream.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// About 1.2 KiB of JSON-like text (compresses well, as real text does).
pub const TEXT: &str = concat!(
    "{\"id\":1,\"name\":\"alpha\",\"tags\":[\"red\",\"green\"],\"text\":\"The quick brown fox jumps over the lazy dog.\"},\n",
    "{\"id\":2,\"name\":\"beta\",\"tags\":[\"blue\"],\"text\":\"Pack my box with five dozen liquor jugs, twice.\"},\n",
    "{\"id\":3,\"name\":\"gamma\",\"tags\":[],\"text\":\"How vexingly quick daft zebras jump over fences.\"},\n",
    "{\"id\":4,\"name\":\"delta\",\"tags\":[\"red\"],\"text\":\"Sphinx of black quartz, judge my vow; again.\"},\n",
    "{\"id\":5,\"name\":\"epsilon\",\"tags\":[\"x\",\"y\"],\"text\":\"The five boxing wizards jump quickly at dawn.\"},\n",
    "{\"id\":6,\"name\":\"zeta\",\"tags\":[\"green\"],\"text\":\"Jackdaws love my big sphinx of quartz, indeed.\"},\n",
    "{\"id\":7,\"name\":\"eta\",\"tags\":[\"blue\",\"red\"],\"text\":\"Mr Jock, TV quiz PhD, bags few lynx at night.\"},\n",
    "{\"id\":8,\"name\":\"theta\",\"tags\":[],\"text\":\"Waltz, bad nymph, for quick jigs vex the crowd.\"},\n",
    "{\"id\":9,\"name\":\"iota\",\"tags\":[\"z\"],\"text\":\"Glib jocks quiz nymph to vex dwarf; then rest.\"},\n",
    "{\"id\":10,\"name\":\"kappa\",\"tags\":[\"red\"],\"text\":\"Quick zephyrs blow, vexing daft Jim, all day.\"},\n",
    "{\"id\":11,\"name\":\"lambda\",\"tags\":[\"k\"],\"text\":\"Two driven jocks help fax my big quiz, again.\"},\n",
);

/// One upstream response and how it is written.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The whole response as written.
    pub bytes: Vec<u8>,
    /// Its decoded body.
    pub body: String,
    /// Written in pieces of this many bytes (0: at once).
    pub piece: usize,
    /// Written in two pieces split here (instead of `piece`).
    pub split_at: Option<usize>,
    /// Bytes written before waiting for the test's gate.
    pub hold_at: Option<usize>,
}

impl Reply {
    /// 200 with `body` framed by `framing` ("length", "chunked" with chunks of varied
    /// sizes, "close"), written in `piece`-byte pieces (0: at once).
    pub fn ok(content_type: &str, body: &str, framing: &str, piece: usize) -> Reply {
        let mut bytes = format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n").into_bytes();
        match framing {
            "length" => {
                let len = body.len();
                bytes.extend(format!("Content-Length: {len}\r\nConnection: close\r\n\r\n").bytes());
                bytes.extend(body.bytes());
            }
            "chunked" => {
                bytes.extend(b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
                let mut rest = body.as_bytes();
                for size in [1usize, 50, 333, 2, 4096].iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let (chunk, after) = rest.split_at((*size).min(rest.len()));
                    bytes.extend(format!("{:x}\r\n", chunk.len()).bytes());
                    bytes.extend(chunk);
                    bytes.extend(b"\r\n");
                    rest = after;
                }
                bytes.extend(b"0\r\n\r\n");
            }
            _ => {
                bytes.extend(b"\r\n");
                bytes.extend(body.bytes());
            }
        }
        Reply {
            bytes,
            body: body.to_string(),
            piece,
            split_at: None,
            hold_at: None,
        }
    }

    /// `HTTP/1.1 {status}` with `headers` (CRLF-ended lines) and a Content-Length body
    /// (none for 204 and 304).
    pub fn raw(status: &str, headers: &str, body: &str) -> Reply {
        let bodiless = status.starts_with("204") || status.starts_with("304");
        let length = if bodiless {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let bytes =
            format!("HTTP/1.1 {status}\r\n{headers}{length}Connection: close\r\n\r\n{body}");
        Reply {
            bytes: bytes.into_bytes(),
            body: body.to_string(),
            piece: 0,
            split_at: None,
            hold_at: None,
        }
    }
}

#[derive(Default)]
struct State {
    reply: Option<Reply>,
    gate: Option<oneshot::Receiver<()>>,
}

/// The upstream: answers every request with the current `Reply`, then closes.
pub struct PieceBackend {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl PieceBackend {
    pub fn start() -> PieceBackend {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((stream, _)) = listener.accept().await {
                    let (reply, gate) = {
                        let mut s = shared.lock().unwrap();
                        (s.reply.clone(), s.gate.take())
                    };
                    if let Some(reply) = reply {
                        tokio::spawn(serve(stream, reply, gate));
                    }
                }
            });
        });
        PieceBackend { addr, state }
    }

    pub fn set(&self, reply: Reply) {
        *self.state.lock().unwrap() = State {
            reply: Some(reply),
            gate: None,
        };
    }

    /// Serves `reply` holding back everything after its first `hold` body bytes (for a
    /// chunked reply, those bytes become the first chunk) until the returned gate fires.
    pub fn set_gated(&self, mut reply: Reply, hold: usize) -> oneshot::Sender<()> {
        let head_end = reply
            .bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap()
            + 4;
        let chunked = String::from_utf8_lossy(&reply.bytes[..head_end]).contains("chunked");
        if chunked {
            let (first, rest) = reply.body.split_at(hold);
            let mut bytes = reply.bytes[..head_end].to_vec();
            bytes.extend(format!("{:x}\r\n{first}\r\n", first.len()).bytes());
            reply.hold_at = Some(bytes.len());
            bytes.extend(format!("{:x}\r\n{rest}\r\n0\r\n\r\n", rest.len()).bytes());
            reply.bytes = bytes;
        } else {
            reply.hold_at = Some(head_end + hold);
        }
        let (tx, rx) = oneshot::channel();
        *self.state.lock().unwrap() = State {
            reply: Some(reply),
            gate: Some(rx),
        };
        tx
    }
}

async fn serve(
    mut stream: tokio::net::TcpStream,
    reply: Reply,
    mut gate: Option<oneshot::Receiver<()>>,
) {
    let _ = stream.set_nodelay(true);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let bytes = &reply.bytes[..];
    let mut cuts: Vec<usize> = match (reply.split_at, reply.piece) {
        (Some(at), _) => vec![at],
        (None, 0) => vec![],
        (None, piece) => (piece..bytes.len()).step_by(piece).collect(),
    };
    if let Some(hold) = reply.hold_at {
        cuts.push(hold);
        cuts.sort_unstable();
    }
    cuts.push(bytes.len());
    let mut from = 0;
    for cut in cuts {
        if stream.write_all(&bytes[from..cut]).await.is_err() {
            return;
        }
        let _ = stream.flush().await;
        if Some(cut) == reply.hold_at {
            if let Some(g) = gate.take() {
                let _ = g.await;
            }
        }
        from = cut;
    }
    let _ = stream.shutdown().await;
}

/// `data` decoded from `algorithm`.
pub fn decode(algorithm: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match algorithm {
        "gzip" => flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .map(drop),
        "br" => brotli::Decompressor::new(data, 4096)
            .read_to_end(&mut out)
            .map(drop),
        "zstd" => zstd::stream::read::Decoder::new(data)
            .and_then(|mut d| d.read_to_end(&mut out))
            .map(drop),
        other => panic!("unknown algorithm {other}"),
    }
    .unwrap_or_else(|e| panic!("{algorithm} body does not decode: {e}"));
    out
}

/// Reads a chunked gzip response as it arrives: the head is skipped, each chunk's data
/// goes through a streaming gzip decoder.
#[derive(Default)]
pub struct ChunkedGzip {
    raw: Vec<u8>,
    head_done: bool,
    ended: bool,
    decoder: Option<flate2::write::GzDecoder<Vec<u8>>>,
}

impl ChunkedGzip {
    pub fn feed(&mut self, bytes: &[u8]) {
        assert!(!bytes.is_empty(), "the connection closed early");
        self.raw.extend_from_slice(bytes);
        let decoder = self
            .decoder
            .get_or_insert_with(|| flate2::write::GzDecoder::new(Vec::new()));
        if !self.head_done {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            self.raw.drain(..end + 4);
            self.head_done = true;
        }
        loop {
            let Some(line) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let text = std::str::from_utf8(&self.raw[..line]).unwrap();
            let size = usize::from_str_radix(text, 16).unwrap();
            if self.raw.len() < line + 2 + size + 2 {
                return;
            }
            decoder
                .write_all(&self.raw[line + 2..line + 2 + size])
                .unwrap();
            decoder.flush().unwrap();
            self.raw.drain(..line + 2 + size + 2);
            if size == 0 {
                self.ended = true;
                return;
            }
        }
    }

    pub fn decoded(&self) -> &[u8] {
        self.decoder.as_ref().map_or(&[], |d| d.get_ref())
    }

    pub fn ended(&self) -> bool {
        self.ended
    }
}
