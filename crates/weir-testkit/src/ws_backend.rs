//! A WebSocket echo backend (RFC 6455 over HTTP/1.1 Upgrade) on its own thread and
//! runtime, stopped when dropped; and the frame helpers its tests use on the client side.
//!
//! The handshake checks `Upgrade: websocket`, `Sec-WebSocket-Version: 13` and a key, and
//! answers 101 with its `Sec-WebSocket-Accept` (and the first `Sec-WebSocket-Protocol`
//! offered, and `Set-Cookie: ws=1`); a path starting with `/refuse-auth` gets 401 with
//! `WWW-Authenticate` and a body, `/refuse` 403, a bad handshake 400. Then each
//! (masked) client frame comes back unmasked: text and binary as they were, PING as
//! PONG, CLOSE as CLOSE followed by the end of the connection. Frames by hand, no
//! fragmentation. A `holding` backend never closes a connection itself: after the client's
//! end of stream it keeps the socket open, silent, until the proxy closes it (a
//! half-closed tail for timeout tests).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_lc_rs::digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::server_thread::ServerThread;

pub const OP_TEXT: u8 = 0x1;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xa;

#[derive(Default)]
struct Stats {
    /// Upgrade request heads, as received.
    heads: Mutex<Vec<String>>,
    upgraded: AtomicUsize,
    /// Upgraded connections that ended (close, EOF or error).
    ended: AtomicUsize,
    /// Upgraded connections whose client ended its stream (EOF read).
    client_ends: AtomicUsize,
    /// Keep the connection open after the client's EOF (until the proxy closes it).
    hold: bool,
}

/// A running WebSocket echo backend.
pub struct WsBackend {
    server: ServerThread,
    stats: Arc<Stats>,
}

impl WsBackend {
    pub fn echo() -> WsBackend {
        WsBackend::spawn(false)
    }

    /// An echo backend that never closes a connection itself (see the module doc).
    pub fn holding() -> WsBackend {
        WsBackend::spawn(true)
    }

    fn spawn(hold: bool) -> WsBackend {
        let stats = Arc::new(Stats {
            hold,
            ..Stats::default()
        });
        let thread_stats = stats.clone();
        let server = ServerThread::spawn(move |listener| accept_loop(listener, thread_stats));
        WsBackend { server, stats }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// The request heads received so far.
    pub fn heads(&self) -> Vec<String> {
        self.stats
            .heads
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }

    /// Connections switched to WebSocket so far.
    pub fn upgraded(&self) -> usize {
        self.stats.upgraded.load(Ordering::SeqCst)
    }

    /// Upgraded connections that have ended.
    pub fn ended(&self) -> usize {
        self.stats.ended.load(Ordering::SeqCst)
    }

    /// Upgraded connections on which the client's end of stream arrived.
    pub fn client_ends(&self) -> usize {
        self.stats.client_ends.load(Ordering::SeqCst)
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<Stats>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let stats = stats.clone();
        tokio::spawn(async move {
            if let Some((tcp, rest)) = handshake(tcp, &stats).await {
                echo(tcp, rest, &stats).await;
                stats.ended.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
}

/// The `Sec-WebSocket-Accept` for `key` (RFC 6455 section 4.2.2).
pub fn accept_for(key: &str) -> String {
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key.as_bytes());
    ctx.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64(ctx.finish().as_ref())
}

fn base64(src: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in src.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(match i <= c.len() {
                true => A[(n >> (18 - 6 * i) & 63) as usize] as char,
                false => '=',
            });
        }
    }
    out
}

/// Reads the Upgrade request and answers it; the connection and the bytes after the head
/// when it switched.
async fn handshake(mut tcp: TcpStream, stats: &Stats) -> Option<(TcpStream, Vec<u8>)> {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    if let Ok(mut heads) = stats.heads.lock() {
        heads.push(head.clone());
    }
    let field = |name: &str| {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let upgrade = field("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let version = field("sec-websocket-version").as_deref() == Some("13");
    let path = head.split(' ').nth(1).unwrap_or("");
    let answer = match (field("sec-websocket-key"), upgrade && version) {
        _ if path.starts_with("/refuse-auth") => "HTTP/1.1 401 Unauthorized\r\n\
            www-authenticate: Bearer realm=\"ws\"\r\ncontent-length: 11\r\n\r\nlogin first"
            .to_string(),
        _ if path.starts_with("/refuse") => {
            "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n".to_string()
        }
        (Some(key), true) => {
            let protocol = field("sec-websocket-protocol")
                .and_then(|p| p.split(',').next().map(|p| p.trim().to_string()))
                .map(|p| format!("sec-websocket-protocol: {p}\r\n"))
                .unwrap_or_default();
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
                 sec-websocket-accept: {}\r\nset-cookie: ws=1\r\n{protocol}\r\n",
                accept_for(&key)
            )
        }
        _ => "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_string(),
    };
    let upgraded = answer.starts_with("HTTP/1.1 101");
    // Counted before the 101 leaves: a client that has seen the upgrade sees the count.
    if upgraded {
        stats.upgraded.fetch_add(1, Ordering::SeqCst);
    }
    tcp.write_all(answer.as_bytes()).await.ok()?;
    upgraded.then(|| (tcp, buf[end..].to_vec()))
}

/// Echoes frames until CLOSE or the end of the connection.
async fn echo(mut tcp: TcpStream, mut buf: Vec<u8>, stats: &Stats) {
    loop {
        while let Some((opcode, payload, used)) = parse_frame(&buf) {
            buf.drain(..used);
            let reply = match opcode {
                OP_PING => OP_PONG,
                op => op,
            };
            if tcp
                .write_all(&ws_frame(reply, &payload, None))
                .await
                .is_err()
            {
                return;
            }
            if opcode == OP_CLOSE {
                let _ = tcp.shutdown().await;
                return;
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        match tcp.read(&mut chunk).await {
            Ok(0) => return client_ended(tcp, stats).await,
            Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Counts the client's end of stream; a holding backend then keeps `tcp` open, silent,
/// for as long as the backend runs.
async fn client_ended(tcp: TcpStream, stats: &Stats) {
    stats.client_ends.fetch_add(1, Ordering::SeqCst);
    if stats.hold {
        std::future::pending::<()>().await;
    }
    drop(tcp);
}

/// One final (FIN) frame; masked with `mask` when given (client frames must be).
pub fn ws_frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    let masked = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(masked | n as u8),
        n if n <= 0xffff => {
            out.push(masked | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(masked | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(m) => {
            out.extend_from_slice(&m);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

/// A complete frame at the start of `buf`: (opcode, unmasked payload, bytes used).
pub fn parse_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    let (b0, b1) = (*buf.first()?, *buf.get(1)?);
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4),
        127 => {
            let b: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            (u64::from_be_bytes(b) as usize, 10)
        }
        n => (n as usize, 2),
    };
    let mask: Option<[u8; 4]> = match masked {
        true => {
            let m = buf.get(at..at + 4)?.try_into().ok()?;
            at += 4;
            Some(m)
        }
        false => None,
    };
    let payload = buf.get(at..at + len)?;
    let payload = match mask {
        Some(m) => payload
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ m[i % 4])
            .collect(),
        None => payload.to_vec(),
    };
    Some((b0 & 0x0f, payload, at + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_accept_matches_the_rfc() {
        for len in [0usize, 5, 125, 126, 70_000] {
            let payload = vec![7u8; len];
            let f = ws_frame(OP_TEXT, &payload, Some([1, 2, 3, 4]));
            assert_eq!(parse_frame(&f), Some((OP_TEXT, payload.clone(), f.len())));
            assert_eq!(parse_frame(&f[..f.len() - 1]), None);
        }
        assert_eq!(
            accept_for("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
