//! At a listener's `max_connections`, a new connection takes the place of an idle one
//! (waiting for its first request byte, idle between keep-alive requests, an HTTP/2
//! connection with no stream, a TLS handshake in progress), as nginx reuses idle
//! connections when it runs out of `worker_connections`: idle sockets cannot lock ready
//! clients out of a listener (issue 24). Connections in the middle of a request (a head
//! half sent, an HTTP/2 stream open) keep their place. The cap is one count across the
//! workers, the idle connections live on each worker: a worker with none of its own asks
//! another to close one.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use common::{single, tls_table, Conf, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::{wait_until_async, Backend};

/// How long a ready client may take for its request (the bound).
const CLIENT_BOUND: Duration = Duration::from_secs(1);
/// An attacker's pause before it reopens a connection Weir closed: it holds its
/// connections, it does not flood (a flood of new connections is for rate limits).
const REOPEN: Duration = Duration::from_millis(200);
const ACTIVE: &str = "weir_connections_active{listener=\"web\"}";
const EVICTED: &str = "weir_connections_evicted_total{listener=\"web\"}";
const PAUSED: &str = "weir_accept_paused_total{listener=\"web\"}";

/// A listener answering every request with its default response, `max_connections = cap`,
/// and timeouts long enough that no idle connection leaves by itself during a test.
fn start(cap: usize, workers: usize) -> Weir {
    Conf::new()
        .workers(workers)
        .listener(&format!("max_connections = {cap}"))
        .listener("header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"")
        .listener("default_response = { status = 404, body = \"none\\n\" }")
        .start()
}

/// Polls `cond` (bounded by [`WAIT`]: only a hang reaches it).
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(wait_until_async(WAIT, cond).await, "never: {what}");
}

/// A keep-alive request on `s` and its whole default response.
async fn request(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"none\n") {
        match s.read(&mut buf).await? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got.extend_from_slice(&buf[..n]),
        }
    }
    assert!(got.starts_with(b"HTTP/1.1 404"), "{got:?}");
    Ok(())
}

/// A new connection served within [`CLIENT_BOUND`], kept open (idle) afterwards.
async fn ready_client(addr: SocketAddr, which: &str) -> TcpStream {
    let started = Instant::now();
    let served = async {
        let mut s = TcpStream::connect(addr).await?;
        request(&mut s).await.map(|()| s)
    };
    match tokio::time::timeout(CLIENT_BOUND, served).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("{which} failed after {:?}: {e}", started.elapsed()),
        Err(_) => panic!("{which} not served within {CLIENT_BOUND:?}"),
    }
}

/// Whether Weir closed `s` (within [`WAIT`]).
async fn closed_by_weir(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(WAIT, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// One idle connection, reopened whenever Weir closes it: silent, or after one request.
async fn hold_idle(addr: SocketAddr, one_request: bool) {
    loop {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            if !one_request || request(&mut s).await.is_ok() {
                // Returns when Weir closes it.
                let _ = s.read(&mut [0u8; 64]).await;
            }
        }
        tokio::time::sleep(REOPEN).await;
    }
}

/// The case: 50 places on two workers, all held by idle connections (half never
/// sending, half idle after one keep-alive request, each reopened when closed); ready
/// clients, one after another, must each be served within a second. Before: the
/// listener paused at the cap and every ready client waited in the backlog until a
/// timeout closed an idle connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_way_to_ready_clients() {
    const CAP: usize = 50;
    let weir = start(CAP, 2);
    let mut attacker = JoinSet::new();
    for i in 0..CAP {
        attacker.spawn(hold_idle(weir.addr, i % 2 == 1));
    }
    // Silent connections reach Weir once the kernel's TCP_DEFER_ACCEPT gives up waiting
    // for their first bytes, after a second or so.
    wait_for("the cap is full of idle connections", || {
        weir.metric_now(ACTIVE) == Some(CAP as u64)
    })
    .await;
    let mut served = Vec::new();
    for i in 0..20 {
        served.push(ready_client(weir.addr, &format!("ready client {i}")).await);
    }
    assert!(weir.metric(EVICTED) >= 20, "{}", weir.metrics_text());
    attacker.abort_all();
}

/// A request head sent in part (a slow client, or slowloris): a request in progress.
const HALF_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n";

/// Every place but one held by connections in the middle of a request head; the one
/// idle connection is on one worker, the newcomer lands on either: a worker with no idle
/// connection of its own asks the other to close one (`weir_accept_paused_total` counts
/// the asks). Each round's newcomer, served and then idle, is the next round's idle one.
/// The half-sent heads are never taken: they finish and are answered at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_idle_connections_asks_another_and_requests_in_progress_stay() {
    const CAP: usize = 10;
    let weir = start(CAP, 2);
    let mut busy = Vec::new();
    for _ in 0..CAP - 1 {
        let mut s = TcpStream::connect(weir.addr).await.unwrap();
        s.write_all(HALF_HEAD).await.unwrap();
        busy.push(s);
    }
    let mut idle = ready_client(weir.addr, "the first idle connection").await;
    wait_for("the cap is full", || {
        weir.metric_now(ACTIVE) == Some(CAP as u64)
    })
    .await;
    // The kernel's spread decides which worker each newcomer lands on: round until one
    // landed on the worker without the idle connection (a 1 in 2^30 chance that 30
    // rounds never do).
    let mut rounds = 0;
    while rounds < 4 || weir.metric(PAUSED) == 0 {
        assert!(rounds < 30, "no newcomer asked the other worker");
        let newcomer = ready_client(weir.addr, &format!("newcomer {rounds}")).await;
        assert!(
            closed_by_weir(&mut idle).await,
            "round {rounds}: the idle one stays"
        );
        idle = newcomer;
        rounds += 1;
    }
    assert_eq!(weir.metric(EVICTED), rounds);
    for (i, s) in busy.iter_mut().enumerate() {
        s.write_all(b"\r\n").await.unwrap();
        let mut got = vec![0u8; 256];
        let n = tokio::time::timeout(WAIT, s.read(&mut got)).await;
        let n = n.expect("answered").expect("read");
        assert!(
            got[..n].starts_with(b"HTTP/1.1 404"),
            "half head {i}: {:?}",
            &got[..n]
        );
    }
}

/// HTTP/2: a connection with no stream open gives way (GOAWAY NO_ERROR, then the close),
/// one with a stream open does not, and its stream finishes.
#[tokio::test]
async fn an_idle_http2_connection_gives_way_and_one_with_an_open_stream_stays() {
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener("max_connections = 2")
        .listener("header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"")
        .start();
    let tcp = TcpStream::connect(weir.addr).await.unwrap();
    let (mut idle, conn) = h2::client::handshake(tcp).await.unwrap();
    let idle_conn = tokio::spawn(conn);
    let response = idle.send_request(get(), true).unwrap().0.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut busy = common::h2c_client(weir.addr).await;
    let post = http::Request::post("http://t/upload").body(()).unwrap();
    let (pending, mut body) = busy.send_request(post, false).unwrap();
    body.send_data(Bytes::from_static(b"half"), false).unwrap();
    wait_for("both are open", || weir.metric_now(ACTIVE) == Some(2)).await;

    let mut newcomer = ready_client_to(weir.addr).await;
    let ended = tokio::time::timeout(WAIT, idle_conn).await.expect("closed");
    assert!(ended.unwrap().is_ok(), "GOAWAY NO_ERROR, then the close");
    assert_eq!(weir.metric(EVICTED), 1);
    body.send_data(Bytes::from_static(b" and the rest"), true)
        .unwrap();
    let response = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    // The newcomer is served again on its kept connection.
    newcomer
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut got = [0u8; 64];
    let n = newcomer.read(&mut got).await.unwrap();
    assert!(got[..n].starts_with(b"HTTP/1.1 200"));
}

fn get() -> http::Request<()> {
    http::Request::get("http://t/").body(()).unwrap()
}

/// A new HTTP/1.1 connection whose request (to the echo backend) is answered within
/// [`CLIENT_BOUND`]; kept open.
async fn ready_client_to(addr: SocketAddr) -> TcpStream {
    let served = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut got = vec![0u8; 1024];
        let n = s.read(&mut got).await.unwrap();
        assert!(got[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &got[..n]);
        s
    };
    tokio::time::timeout(CLIENT_BOUND, served)
        .await
        .expect("the newcomer is served at once")
}

/// TLS: silent sockets hold the listener's places in their handshakes; a ready client
/// takes the place of the idlest (counted as an eviction at max_connections and as an
/// evicted handshake) instead of waiting for `handshake_timeout`.
#[tokio::test]
async fn silent_sockets_on_a_tls_listener_give_way() {
    const CAP: usize = 4;
    const NAME: &str = "reclaim.example.com";
    let ca = TestCa::new("reclaim CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener(&format!("max_connections = {CAP}"))
        .listener(&tls_table(&[&leaf], "handshake_timeout = \"60s\"\n"))
        .start();
    let mut silent = Vec::new();
    for _ in 0..CAP {
        silent.push(TcpStream::connect(weir.addr).await.unwrap());
    }
    wait_for("the silent sockets are accepted", || {
        weir.metric_now(ACTIVE) == Some(CAP as u64)
    })
    .await;
    let connector = tokio_rustls::TlsConnector::from(ca.client_config());
    let served = async {
        let tcp = TcpStream::connect(weir.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(NAME).unwrap();
        let mut s = connector.connect(name, tcp).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: reclaim.example.com\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        out
    };
    let out = tokio::time::timeout(CLIENT_BOUND, served)
        .await
        .expect("the ready client is served at once");
    assert!(out.starts_with(b"HTTP/1.1 200"), "{out:?}");
    assert_eq!(weir.metric(EVICTED), 1);
    let evicted = "weir_tls_handshake_failures_total{listener=\"web\",reason=\"evicted\"}";
    wait_for("the handshake is counted", || {
        weir.metric_now(evicted) == Some(1)
    })
    .await;
}
