//! A raw HTTP/2 client for attack tests: writes hand-made frames (including the ones a
//! well-behaved client such as the `h2` crate's never sends) and reads the server's frames
//! back undecoded, so a test can mount a flood or a protocol abuse over a real socket and
//! see exactly what the server answered (GOAWAY and its code, RST_STREAM, a close).
//!
//! Header blocks are HPACK by hand: [`Block`] writes indexed fields, literals (with or
//! without indexing into the dynamic table) and nothing else; no Huffman.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Frame types (RFC 9113 section 6).
pub mod kind {
    pub const DATA: u8 = 0;
    pub const HEADERS: u8 = 1;
    pub const PRIORITY: u8 = 2;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;
    pub const WINDOW_UPDATE: u8 = 8;
    pub const CONTINUATION: u8 = 9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
}

/// A frame read from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl RawFrame {
    /// The error code of a GOAWAY or RST_STREAM.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            kind::GOAWAY => 4,
            kind::RST_STREAM => 0,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// How a connection ended, as [`RawH2::until_goaway`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A GOAWAY with this error code (the connection may still be open).
    GoAway(u32),
    /// Closed (EOF or reset) without a GOAWAY.
    Closed,
    /// Neither within the time given.
    Open,
}

/// Appends one frame to `out`.
pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK header block under construction.
#[derive(Debug, Default, Clone)]
pub struct Block(pub Vec<u8>);

impl Block {
    /// `:method GET`, `:scheme http`, `:path` and `:authority example.test`.
    pub fn get(path: &str) -> Block {
        Block::default()
            .indexed(2)
            .indexed(6)
            .literal_indexed_name(4, path)
            .literal_indexed_name(1, "example.test")
    }

    /// As [`Block::get`] with `:method POST`.
    pub fn post(path: &str) -> Block {
        Block::default()
            .indexed(3)
            .indexed(6)
            .literal_indexed_name(4, path)
            .literal_indexed_name(1, "example.test")
    }

    /// An indexed field (static table 1..=61, dynamic from 62).
    pub fn indexed(mut self, index: u8) -> Block {
        assert!(index < 127, "one-byte index");
        self.0.push(0x80 | index);
        self
    }

    /// A literal without indexing whose name is the static entry `index` (< 15).
    pub fn literal_indexed_name(mut self, index: u8, value: &str) -> Block {
        assert!(index < 15, "four-bit index");
        self.0.push(index);
        string(&mut self.0, value.as_bytes());
        self
    }

    /// A literal field, new name, without indexing.
    pub fn literal(mut self, name: &str, value: &[u8]) -> Block {
        self.0.push(0x00);
        string(&mut self.0, name.as_bytes());
        string(&mut self.0, value);
        self
    }

    /// A literal field, new name, added to the dynamic table (as entry 62).
    pub fn literal_add(mut self, name: &str, value: &[u8]) -> Block {
        self.0.push(0x40);
        string(&mut self.0, name.as_bytes());
        string(&mut self.0, value);
        self
    }
}

/// An HPACK string literal (no Huffman), with its 7-bit-prefix length.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

fn integer(out: &mut Vec<u8>, high: u8, bits: u32, mut n: usize) {
    let max = (1usize << bits) - 1;
    if n < max {
        out.push(high | n as u8);
        return;
    }
    out.push(high | max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// A raw HTTP/2 connection (h2c, prior knowledge).
pub struct RawH2 {
    pub tcp: TcpStream,
    buf: Vec<u8>,
}

impl RawH2 {
    /// Connects, sends the preface and a SETTINGS frame with `settings` ((id, value)
    /// pairs), and acknowledges nothing yet.
    pub async fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> std::io::Result<RawH2> {
        RawH2::start(TcpStream::connect(addr).await?, settings).await
    }

    /// As [`RawH2::connect`], with a small receive buffer (4 KiB asked; the kernel may
    /// round up): for clients that never read, so the server's writes stall soon instead
    /// of filling megabytes of socket buffers first.
    pub async fn connect_not_reading(
        addr: SocketAddr,
        settings: &[(u16, u32)],
    ) -> std::io::Result<RawH2> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        RawH2::start(socket.connect(addr).await?, settings).await
    }

    async fn start(mut tcp: TcpStream, settings: &[(u16, u32)]) -> std::io::Result<RawH2> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let mut payload = Vec::new();
        for (id, value) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        frame(&mut out, kind::SETTINGS, 0, 0, &payload);
        tcp.write_all(&out).await?;
        Ok(RawH2 {
            tcp,
            buf: Vec::new(),
        })
    }

    /// Writes bytes (frames made with [`frame`]).
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tcp.write_all(bytes).await
    }

    /// Writes one frame.
    pub async fn send_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(9 + payload.len());
        frame(&mut out, kind, flags, stream, payload);
        self.send(&out).await
    }

    /// Reads the next frame (`None`: the connection closed or failed).
    pub async fn read_frame(&mut self) -> Option<RawFrame> {
        loop {
            if self.buf.len() >= 9 {
                let b = &self.buf;
                let len = (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize;
                if self.buf.len() >= 9 + len {
                    let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
                    let f = RawFrame {
                        kind: b[3],
                        flags: b[4],
                        stream,
                        payload: b[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads frames until `pick` returns something, the connection closes (`None`) or
    /// `timeout` passes (`None`).
    pub async fn until<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&RawFrame) -> Option<T>,
    ) -> Option<T> {
        let wait = async {
            while let Some(f) = self.read_frame().await {
                if let Some(t) = pick(&f) {
                    return Some(t);
                }
            }
            None
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Reads frames until a GOAWAY, the close of the connection, or `timeout`.
    pub async fn until_goaway(&mut self, timeout: Duration) -> Ending {
        let wait = async {
            while let Some(f) = self.read_frame().await {
                if f.kind == kind::GOAWAY {
                    return Ending::GoAway(f.error_code().unwrap_or(u32::MAX));
                }
            }
            Ending::Closed
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or(Ending::Open)
    }

    /// Reads until the server closes the connection; false when `timeout` passed first.
    pub async fn until_closed(&mut self, timeout: Duration) -> bool {
        let wait = async { while self.read_frame().await.is_some() {} };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_and_blocks() {
        let mut out = Vec::new();
        integer(&mut out, 0, 7, 4000);
        // 127, then 3873 = 0x21 + 0x1e * 128 in 7-bit groups.
        assert_eq!(out, [0x7f, 0xa1, 0x1e]);
        let b = Block::get("/x");
        assert_eq!(b.0, b"\x82\x86\x04\x02/x\x01\x0cexample.test");
        let mut f = Vec::new();
        frame(&mut f, kind::PING, 0, 0, &[0; 8]);
        assert_eq!(&f[..9], &[0, 0, 8, 6, 0, 0, 0, 0, 0]);
    }
}
