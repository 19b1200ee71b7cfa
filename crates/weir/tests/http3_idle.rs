//! An HTTP/3 connection with no request stream open is idle, as an HTTP/1.1 connection
//! between requests or an HTTP/2 one with no stream: it closes (H3_NO_ERROR) once idle
//! for `keepalive_timeout` (`header_timeout` before its first request), whatever QUIC
//! PINGs keep its QUIC connection alive, and at the listener's `max_connections` it gives
//! its place to a newcomer of either transport (`weir_connections_evicted_total`). One
//! with a request under way keeps its place. Before, idle QUIC connections held their
//! places for life: ten of them locked a listener with `max_connections = 10` out, over
//! TCP too (attacker review, finding 1).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::h3_client::{
    connect_to, get, quic_connect, quic_connect_with, ConnectionError, H3Client, TransportConfig,
};
use weir_testkit::{wait_until_async, Backend};

use common::{single, tls_table, Weir, WAIT};

const NAME: &str = "idle.example.com";
const ACTIVE: &str = "weir_connections_active{listener=\"web\"}";
const EVICTED: &str = "weir_connections_evicted_total{listener=\"web\"}";
const RETRIES: &str = "weir_http3_retries_total{listener=\"web\"}";
/// HTTP/3's NO_ERROR (RFC 9114 8.1).
const H3_NO_ERROR: u32 = 0x100;
/// How long a newcomer at the cap may take to be served (an idle connection closes for
/// it at once).
const CLIENT_BOUND: Duration = Duration::from_secs(2);

/// Weir with an `http3` TLS listener for `leaf` in front of `backend`, with `listener`'s
/// lines. QUIC's own `idle_timeout` is long: only Weir's idle bounds close a connection.
fn start(backend: SocketAddr, leaf: &Leaf, listener: &str) -> Weir {
    single(backend)
        .listener(listener)
        .listener("http3 = { idle_timeout = \"120s\" }")
        .listener(&tls_table(&[leaf], "handshake_timeout = \"10s\"\n"))
        .start()
}

/// Weir capped at `max` connections, with long idle bounds (only the cap makes an idle
/// connection close), with its CA, leaf (keep it while Weir runs) and backend.
fn capped(max: usize) -> (TestCa, Leaf, Backend, Weir) {
    let ca = TestCa::new("h3 idle CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    let long = "header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"";
    let weir = start(b.addr(), &leaf, &format!("max_connections = {max}\n{long}"));
    (ca, leaf, b, weir)
}

/// Waits for `c`'s connection to close and returns why.
async fn closed(c: &H3Client) -> ConnectionError {
    let closed = tokio::time::timeout(WAIT, c.connection.closed()).await;
    closed.expect("the connection closes")
}

/// Whether `e` is Weir closing the connection on purpose (H3_NO_ERROR).
fn closed_with_no_error(e: &ConnectionError) -> bool {
    matches!(e, ConnectionError::ApplicationClosed(a) if a.error_code.into_inner() == u64::from(H3_NO_ERROR))
}

/// A TLS connection to `addr` whose HTTP/1.1 request is answered within
/// [`CLIENT_BOUND`]; kept open (idle) afterwards.
async fn tls_client(ca: &TestCa, addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(ca.client_config());
    let served = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(NAME).unwrap();
        let mut s = connector.connect(name, tcp).await.unwrap();
        let head = format!("GET / HTTP/1.1\r\nHost: {NAME}\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut got = vec![0u8; 2048];
        let n = s.read(&mut got).await.unwrap();
        assert!(got[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &got[..n]);
        s
    };
    tokio::time::timeout(CLIENT_BOUND, served)
        .await
        .expect("the TLS client is served at once")
}

/// An HTTP/3 connection whose GET is answered within [`CLIENT_BOUND`].
async fn h3_client(ca: &TestCa, addr: SocketAddr) -> H3Client {
    let served = async {
        let mut c = connect_to(ca, addr, NAME).await;
        let r = get(&mut c.send, NAME, "/").await.expect("GET");
        assert_eq!(r.status, 200);
        c
    };
    tokio::time::timeout(CLIENT_BOUND, served)
        .await
        .expect("the HTTP/3 client is served at once")
}

/// `c`'s connection is a kept one: served again.
async fn served_again(c: &mut H3Client) {
    let r = get(&mut c.send, NAME, "/again").await.expect("GET");
    assert_eq!(r.status, 200);
}

/// Idle after a request: closed with H3_NO_ERROR after `keepalive_timeout` (1 s), well
/// before `header_timeout` (4 s); never sending one: after `header_timeout`. QUIC's
/// `idle_timeout` (120 s) would close neither before the wait ends. Before, both stayed
/// open until QUIC's idle timeout; then the served one lasted `header_timeout` too (its
/// timer was not shortened by its request).
#[tokio::test]
async fn idle_connections_close_after_keepalive_timeout_and_header_timeout() {
    let ca = TestCa::new("h3 idle CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    let weir = start(
        b.addr(),
        &leaf,
        "header_timeout = \"4s\"\nkeepalive_timeout = \"1s\"",
    );
    let started = Instant::now();
    let silent = connect_to(&ca, weir.addr, NAME).await;
    let served = h3_client(&ca, weir.addr).await;
    let why = closed(&served).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    let after = started.elapsed();
    assert!(
        after < Duration::from_secs(3),
        "keepalive_timeout: {after:?}"
    );
    let why = closed(&silent).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "not before header_timeout"
    );
    wait_until_async(WAIT, || weir.metric_now(ACTIVE) == Some(0)).await;
    assert_eq!(weir.metric(ACTIVE), 0);
}

/// At the cap, held by idle HTTP/3 connections (one after a request, one that never sent
/// any), a TLS client over TCP is served at once: the idlest HTTP/3 connection closes for
/// it. Before, the TCP newcomer waited in the backlog until QUIC's idle timeout.
#[tokio::test]
async fn a_tcp_newcomer_takes_the_place_of_an_idle_h3_connection() {
    let (ca, _leaf, _b, weir) = capped(2);
    let silent = connect_to(&ca, weir.addr, NAME).await;
    let served = h3_client(&ca, weir.addr).await;
    assert!(wait_until_async(WAIT, || weir.metric_now(ACTIVE) == Some(2)).await);
    let _newcomer = tls_client(&ca, weir.addr).await;
    // The idlest (the silent one, set up first) gave way.
    let why = closed(&silent).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    assert_eq!(weir.metric(EVICTED), 1);
    assert!(
        served.connection.close_reason().is_none(),
        "only one gave way"
    );
}

/// The reverse: at the cap, held by idle TLS connections over TCP, an HTTP/3 client is
/// served at once. Before, it was refused (CONNECTION_REFUSED).
#[tokio::test]
async fn an_h3_newcomer_takes_the_place_of_an_idle_tcp_connection() {
    let (ca, _leaf, _b, weir) = capped(2);
    let mut idle = tls_client(&ca, weir.addr).await;
    let _other = tls_client(&ca, weir.addr).await;
    assert!(wait_until_async(WAIT, || weir.metric_now(ACTIVE) == Some(2)).await);
    let mut newcomer = h3_client(&ca, weir.addr).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the idlest TCP one closed"
    );
    assert_eq!(weir.metric(EVICTED), 1);
    served_again(&mut newcomer).await;
}

/// An HTTP/3 connection with a request under way (a body half sent) keeps its place: an
/// idle one gives way to the newcomer, and the request then finishes.
#[tokio::test]
async fn an_h3_connection_with_a_request_under_way_keeps_its_place() {
    let (ca, _leaf, b, weir) = capped(2);
    let mut busy = connect_to(&ca, weir.addr, NAME).await;
    let idle = h3_client(&ca, weir.addr).await;
    let post = Request::post(format!("https://{NAME}/upload"))
        .header("content-length", "17")
        .body(())
        .unwrap();
    let mut stream = busy.send.send_request(post).await.unwrap();
    stream.send_data(Bytes::from_static(b"half")).await.unwrap();
    // Its head reached the backend: Weir has the stream.
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    assert!(wait_until_async(WAIT, || weir.metric_now(ACTIVE) == Some(2)).await);
    // The busy connection is the idlest by its setup: it would go first if it were idle.
    let _newcomer = tls_client(&ca, weir.addr).await;
    let why = closed(&idle).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    assert_eq!(weir.metric(EVICTED), 1);
    stream
        .send_data(Bytes::from_static(b" and the rest"))
        .await
        .unwrap();
    stream.finish().await.unwrap();
    let response = tokio::time::timeout(WAIT, stream.recv_response()).await;
    assert_eq!(response.expect("answered").expect("response").status(), 200);
    assert!(busy.connection.close_reason().is_none());
}

/// A stream opened with no head (a HEADERS frame begun, never ended) is no request under
/// way: at the cap the connection gives its place to a TCP newcomer. Before, the stream
/// made the connection busy until `header_timeout`, and one such stream every few
/// seconds held the place for ever (review of the idle change, 1).
#[tokio::test]
async fn a_stream_without_a_head_does_not_keep_the_place() {
    let (ca, _leaf, _b, weir) = capped(1);
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    let (mut headless, _recv) = c.connection.open_bi().await.unwrap();
    // HEADERS, 16 bytes long: none of them comes.
    headless.write_all(&[0x01, 0x10]).await.unwrap();
    // A request on a later stream is answered: Weir has accepted the headless one.
    let r = get(&mut c.send, NAME, "/").await.expect("GET");
    assert_eq!(r.status, 200);
    let _newcomer = tls_client(&ca, weir.addr).await;
    let why = closed(&c).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    assert_eq!(weir.metric(EVICTED), 1);
}

/// A client that lets the server open no unidirectional stream keeps Weir from opening
/// its control stream: the connection is still idle, and gives its place to a TCP
/// newcomer at the cap. Before, its task waited for ever for the stream: the eviction was
/// counted, but the connection kept its place and the newcomer waited.
#[tokio::test]
async fn a_client_refusing_the_control_stream_does_not_keep_the_place() {
    let (ca, _leaf, _b, weir) = capped(1);
    let mut transport = TransportConfig::default();
    transport.max_concurrent_uni_streams(0u8.into());
    let tls = ca.client_config();
    let connected = quic_connect_with(weir.addr, NAME, &tls, transport).await;
    let (_endpoint, quic) = connected.expect("QUIC connection");
    assert!(wait_until_async(WAIT, || weir.metric_now(ACTIVE) == Some(1)).await);
    let _newcomer = tls_client(&ca, weir.addr).await;
    let closed = tokio::time::timeout(WAIT, quic.closed()).await;
    let why = closed.expect("the connection closes");
    assert!(closed_with_no_error(&why), "{why:?}");
    assert_eq!(weir.metric(EVICTED), 1);
}

/// At the cap, an HTTP/3 newcomer proves its address (a Retry) before it may take an
/// idle connection's place: a spoofed Initial cannot evict. Before, it went straight to
/// the eviction (no Retry).
#[tokio::test]
async fn an_h3_newcomer_at_the_cap_gets_a_retry_first() {
    let (ca, _leaf, _b, weir) = capped(1);
    let idle = h3_client(&ca, weir.addr).await;
    assert_eq!(weir.metric(RETRIES), 0, "no Retry below the cap");
    let mut newcomer = h3_client(&ca, weir.addr).await;
    assert_eq!(weir.metric(RETRIES), 1);
    let why = closed(&idle).await;
    assert!(closed_with_no_error(&why), "{why:?}");
    assert_eq!(weir.metric(EVICTED), 1);
    served_again(&mut newcomer).await;
}

/// A connection that gives way at the cap gets GOAWAY before its close, as an HTTP/2 one
/// does (the client learns that no request was lost). Before, it was closed without one.
#[tokio::test]
async fn an_evicted_h3_connection_gets_goaway() {
    let (ca, _leaf, _b, weir) = capped(1);
    let tls = ca.client_config();
    let (_endpoint, quic) = quic_connect(weir.addr, NAME, &tls).await.unwrap();
    // Weir's control stream (its first unidirectional stream): type, then SETTINGS.
    let mut control = quic.accept_uni().await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    let n = control.read(&mut chunk).await.unwrap().unwrap();
    got.extend_from_slice(&chunk[..n]);
    let _newcomer = tls_client(&ca, weir.addr).await;
    let reading = async {
        while let Ok(Some(n)) = control.read(&mut chunk).await {
            got.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(WAIT, reading)
        .await
        .expect("the connection closes");
    assert_eq!(got[0], 0x00, "a control stream");
    assert!(frame_types(&got[1..]).contains(&0x07), "GOAWAY: {got:?}");
    assert_eq!(weir.metric(EVICTED), 1);
}

/// The types of the HTTP/3 frames in `bytes` (whole frames only).
fn frame_types(mut bytes: &[u8]) -> Vec<u64> {
    let mut types = Vec::new();
    while let Some((kind, rest)) = varint(bytes) {
        let Some((len, rest)) = varint(rest) else {
            break;
        };
        let Some(rest) = rest.get(len as usize..) else {
            break;
        };
        types.push(kind);
        bytes = rest;
    }
    types
}

/// A QUIC variable-length integer at the start of `bytes`, and what follows it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let first = *bytes.first()?;
    let len = 1usize << (first >> 6);
    let raw = bytes.get(..len)?;
    let value = raw[1..]
        .iter()
        .fold(u64::from(first & 0x3f), |v, b| (v << 8) | u64::from(*b));
    Some((value, &bytes[len..]))
}

/// A reload that removes an HTTP/3 listener: a connection with a request under way gets
/// GOAWAY within about `keepalive_timeout` (at least a second), as an HTTP/2 one does, and
/// its request still finishes; then the connection closes. Before, it went on taking
/// requests (each refused) until it was idle.
#[tokio::test]
async fn a_busy_h3_connection_gets_goaway_when_its_listener_is_removed() {
    let ca = TestCa::new("h3 removed CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    // No body rate: the body waits on the test as long as it takes.
    let weir = start(
        b.addr(),
        &leaf,
        "keepalive_timeout = \"300ms\"\nmin_body_rate = 0",
    );
    let tls = ca.client_config();
    let (_endpoint, quic) = quic_connect(weir.addr, NAME, &tls).await.unwrap();
    let mut control = quic.accept_uni().await.unwrap();
    // A POST (QPACK, static table only: POST, https, /, then :authority) and part of its
    // body: under way.
    let (mut send, mut recv) = quic.open_bi().await.unwrap();
    let mut head = vec![0x00, 0x00, 0xd4, 0xd7, 0xc1, 0x50, NAME.len() as u8];
    head.extend_from_slice(NAME.as_bytes());
    let mut frames = vec![0x01, head.len() as u8];
    frames.extend_from_slice(&head);
    frames.extend_from_slice(&[0x00, 0x04]);
    frames.extend_from_slice(b"half");
    send.write_all(&frames).await.unwrap();
    assert!(wait_until_async(WAIT, || b.in_flight() == 1).await);
    let without = single(b.addr())
        .toml()
        .replace("name = \"web\"", "name = \"other\"");
    weir.apply_text(&without).expect("apply");
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    let goaway = async {
        while !frame_types(got.get(1..).unwrap_or_default()).contains(&0x07) {
            let n = control.read(&mut chunk).await.unwrap().expect("open");
            got.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(WAIT, goaway).await.expect("GOAWAY");
    assert_eq!(b.in_flight(), 1, "the request is still under way");
    send.write_all(&[0x00, 0x04]).await.unwrap();
    send.write_all(b"rest").await.unwrap();
    send.finish().unwrap();
    let answer = tokio::time::timeout(WAIT, recv.read_to_end(64 * 1024)).await;
    let answer = answer.expect("answered").expect("a response");
    assert_eq!(answer.first(), Some(&0x01), "a HEADERS frame first");
    let why = tokio::time::timeout(WAIT, quic.closed())
        .await
        .expect("closes");
    assert!(closed_with_no_error(&why), "{why:?}");
}
