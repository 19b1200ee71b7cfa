//! Still tunnels end (HTTP/1.1 Upgrade to a WebSocket backend): a tunnel where nothing
//! moves for `tunnel_idle_timeout` is closed on both sides, an active one outlives that
//! bound, and once one side half-closed, a tail where the other stays silent is closed
//! after `tunnel_fin_timeout`; a reloaded bound applies to new tunnels. Each close counts
//! in `weir_tunnel_timeouts_total`. (RFC 8441 tunnels: h2_websocket.rs; TCP listeners'
//! `fin_timeout`: tcp_listener.rs.)

mod common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::{single, Weir, WAIT};
use weir_testkit::ws_backend::{accept_for, parse_frame, ws_frame, OP_TEXT};
use weir_testkit::{wait_until_async, WsBackend};

const UPGRADE_REQUEST: &[u8] = b"GET /chat HTTP/1.1\r\nHost: h\r\n\
    Connection: Upgrade\r\nUpgrade: websocket\r\n\
    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// A tunnel through `weir`: the upgrade request sent and its 101 read (byte by byte, so no
/// tunnel byte is taken with it).
async fn open_tunnel(weir: &Weir) -> TcpStream {
    open_tunnel_over(TcpStream::connect(weir.addr).await.expect("connect")).await
}

/// [`open_tunnel`] over the connected socket `s`.
async fn open_tunnel_over(mut s: TcpStream) -> TcpStream {
    s.write_all(UPGRADE_REQUEST).await.expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(WAIT, s.read_exact(&mut b)).await;
        read.expect("head in time").expect("head");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "), "{head:?}");
    s
}

/// One text frame through the tunnel and its echo back.
async fn echo_once(s: &mut TcpStream, payload: &[u8]) {
    s.write_all(&ws_frame(OP_TEXT, payload, Some([1, 2, 3, 4])))
        .await
        .expect("write");
    let mut buf = Vec::new();
    loop {
        if let Some((op, got, _)) = parse_frame(&buf) {
            assert_eq!((op, got.as_slice()), (OP_TEXT, payload));
            return;
        }
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk)).await;
        let n = n.expect("echo in time").expect("read");
        assert!(n > 0, "tunnel closed before the echo");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Waits (at most `WAIT`) for Weir to close the client side; no byte may come first.
async fn closed_by_weir(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, s.read(&mut buf)).await;
    match read.expect("weir closed the still tunnel") {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("unexpected bytes {:?}", &buf[..n]),
    }
}

/// (No echo first: its round trip would race the short bound; the 101 proves the tunnel.)
#[tokio::test]
async fn an_idle_tunnel_is_closed_after_tunnel_idle_timeout() {
    let backend = WsBackend::echo();
    let conf = single(backend.addr()).listener("tunnel_idle_timeout = \"300ms\"");
    let weir = conf.start();
    let mut s = open_tunnel(&weir).await;
    closed_by_weir(&mut s).await;
    assert!(
        wait_until_async(WAIT, || backend.ended() == 1).await,
        "the upstream side was closed too"
    );
    assert_eq!(weir.tunnel_timeouts(), (1, 0));
}

#[tokio::test]
async fn an_active_tunnel_outlives_tunnel_idle_timeout() {
    let backend = WsBackend::echo();
    let conf = single(backend.addr()).listener("tunnel_idle_timeout = \"3s\"");
    let weir = conf.start();
    let mut s = open_tunnel(&weir).await;
    // Echoes back to back for over the bound: the tunnel is never still for it. Only a
    // single round trip stalled for the whole 3 s bound could end it.
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_secs(4) {
        echo_once(&mut s, format!("message {n}").as_bytes()).await;
        n += 1;
    }
    echo_once(&mut s, b"still open").await;
    assert_eq!(backend.ended(), 0);
    assert_eq!(weir.tunnel_timeouts(), (0, 0));
}

#[tokio::test]
async fn a_half_closed_tunnel_whose_other_side_is_silent_is_closed_after_tunnel_fin_timeout() {
    let backend = WsBackend::holding();
    // The idle bound (the default, 1h) is not what ends it.
    let conf = single(backend.addr()).listener("tunnel_fin_timeout = \"300ms\"");
    let weir = conf.start();
    let mut s = open_tunnel(&weir).await;
    echo_once(&mut s, b"last words").await;
    s.shutdown().await.expect("half-close");
    assert!(
        wait_until_async(WAIT, || backend.client_ends() == 1).await,
        "the client's FIN was passed on"
    );
    closed_by_weir(&mut s).await;
    assert_eq!(weir.tunnel_timeouts(), (0, 1));
}

/// An upstream that answers the upgrade with a 101, then sends as fast as it can until
/// the connection breaks.
fn streaming_upgrade_backend() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let addr = listener.local_addr().expect("backend addr");
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read_exact(&mut b).is_ok() {
                    head.push(b[0]);
                }
                let accept = accept_for("dGhlIHNhbXBsZSBub25jZQ==");
                let answer = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                     Upgrade: websocket\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
                );
                let block = vec![7u8; 64 * 1024];
                let _ = s.write_all(answer.as_bytes());
                while s.write_all(&block).is_ok() {}
            });
        }
    });
    addr
}

/// A client that reads slowly (see `common::read_slowly`) from an upstream sending as
/// fast as it can, with a 2 s bound: Weir's writes to the client wait for room and its
/// reads wait on them, but the bytes the client takes are progress, so the tunnel stays
/// open.
#[tokio::test]
async fn a_slow_reader_keeps_its_tunnel_open() {
    let upstream = streaming_upgrade_backend();
    let conf = single(upstream).listener("tunnel_idle_timeout = \"2s\"");
    let weir = conf.start();
    let mut s = open_tunnel_over(common::small_window(weir.addr).await).await;
    let got = common::read_slowly(&mut s).await;
    assert_eq!(weir.tunnel_timeouts(), (0, 0), "after {got} bytes");
}

/// The bounds reload like the other timeouts: a tunnel opened after the reload gets the
/// new `tunnel_idle_timeout`.
#[tokio::test]
async fn a_reloaded_tunnel_idle_timeout_applies_to_new_tunnels() {
    let backend = WsBackend::echo();
    let weir = single(backend.addr()).start();
    let shorter = single(backend.addr()).listener("tunnel_idle_timeout = \"300ms\"");
    weir.apply_text(&shorter.toml()).expect("reload");
    let mut s = open_tunnel(&weir).await;
    closed_by_weir(&mut s).await;
    assert_eq!(weir.tunnel_timeouts(), (1, 0));
}
