//! Issue 24: connections that stall their TLS handshake (silent, or half a ClientHello)
//! must not lock ready clients out of a TLS listener. At `max_handshakes` a newcomer takes
//! the place of the handshake idle longest (`weir_tls_handshake_failures_total{reason=
//! "evicted"}`) instead of being closed at accept.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

use common::{raise_fd_limit, single, tls_table, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::Backend;

const NAME: &str = "lock.example.com";

/// A handshake and one request (`Connection: close`) on a new connection; the response.
async fn handshake_and_get(addr: SocketAddr, config: Arc<ClientConfig>) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(NAME).expect("server name");
    let mut s = TlsConnector::from(config).connect(name, tcp).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: lock.example.com\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The first half of a real ClientHello record (what a stalling client sends).
fn half_client_hello(config: Arc<ClientConfig>) -> Vec<u8> {
    let name = ServerName::try_from(NAME).expect("server name");
    let mut client = rustls::ClientConnection::new(config, name).expect("client");
    let mut hello = Vec::new();
    client.write_tls(&mut hello).expect("ClientHello");
    hello.truncate(hello.len() / 2);
    hello
}

fn evicted(weir: &Weir) -> u64 {
    let series = "weir_tls_handshake_failures_total{listener=\"web\",reason=\"evicted\"}";
    weir.metric_now(series).unwrap_or(0)
}

/// Waits until `cond` holds, polling (bounded by [`WAIT`]: only a hang reaches it).
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_ready_client_takes_the_place_of_a_stalled_handshake() {
    let ca = TestCa::new("evict CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener(&tls_table(
            &[&leaf],
            "handshake_timeout = \"3s\"\nmax_handshakes = 1\n",
        ))
        .start();
    // The start of a TLS record, then nothing: the handshake holds the worker's one place.
    let mut slow = TcpStream::connect(weir.addr).await.unwrap();
    slow.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let active = "weir_connections_active{listener=\"web\"}";
    wait_for("the stalled connection is accepted", || {
        weir.metric_now(active) == Some(1)
    })
    .await;
    let response = handshake_and_get(weir.addr, ca.client_config()).await;
    assert!(response.unwrap().starts_with("HTTP/1.1 200"));
    // The stalled one gave its place up: closed, counted.
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    wait_for("the eviction is counted", || evicted(&weir) == 1).await;
    // Alone, a stalled handshake still ends at handshake_timeout.
    let mut alone = TcpStream::connect(weir.addr).await.unwrap();
    alone.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let _ = alone.read_to_end(&mut rest).await;
    let timeout = "weir_tls_handshake_failures_total{listener=\"web\",reason=\"timeout\"}";
    wait_for("the timeout is counted", || {
        weir.metric_now(timeout) == Some(1)
    })
    .await;
    assert_eq!(evicted(&weir), 1);
}

/// Stalled connections the attacker keeps open.
const STALLED: usize = 1000;
/// Ready clients that must each get through while they are held.
const CLIENTS: usize = 20;
/// How long a ready client may take for its handshake and request (the bound).
const CLIENT_BOUND: Duration = Duration::from_secs(1);
/// An attacker's pause before it reopens a connection Weir closed: it holds its
/// connections, it does not flood (a flood of new connections is for rate limits).
const REOPEN: Duration = Duration::from_millis(200);

/// One stalled connection, reopened whenever Weir closes it: silent, or sending `prefix`.
async fn hold_stalled(addr: SocketAddr, prefix: Option<Arc<Vec<u8>>>) {
    loop {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            if let Some(bytes) = &prefix {
                let _ = s.write_all(bytes).await;
            }
            // Returns when Weir closes it (evicted or timed out).
            let _ = s.read(&mut [0u8; 64]).await;
        }
        tokio::time::sleep(REOPEN).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_stalled_handshakes_lock_no_ready_client_out() {
    // The attacker's sockets and Weir's (one process), with room to spare.
    let fds = raise_fd_limit(4 * STALLED as u64 + 1024);
    assert!(
        fds > 2 * STALLED as u64 + 256,
        "open-file limit {fds} too low for this test"
    );
    let ca = TestCa::new("lockout CA");
    let leaf = ca.leaf(&[NAME]);
    let b = Backend::echo("app");
    // Default TLS settings (max_handshakes = 256 per worker), two workers: 512 places.
    let weir = single(b.addr())
        .workers(2)
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let half = Arc::new(half_client_hello(ca.client_config()));
    let mut attacker = JoinSet::new();
    for i in 0..STALLED {
        let prefix = (i % 2 == 1).then(|| half.clone());
        attacker.spawn(hold_stalled(weir.addr, prefix));
    }
    // Every handshake place is taken (silent connections reach Weir once the kernel's
    // TCP_DEFER_ACCEPT gives up waiting for their first bytes, after a second or so).
    let active = "weir_connections_active{listener=\"web\"}";
    wait_for("512 stalled connections are accepted", || {
        weir.metric_now(active).unwrap_or(0) >= 512
    })
    .await;
    let config = ca.client_config();
    for i in 0..CLIENTS {
        let started = Instant::now();
        let served =
            tokio::time::timeout(CLIENT_BOUND, handshake_and_get(weir.addr, config.clone()));
        match served.await {
            Ok(Ok(response)) => assert!(
                response.starts_with("HTTP/1.1 200"),
                "client {i}: {response}"
            ),
            Ok(Err(e)) => panic!(
                "client {i} of {CLIENTS} failed after {:?}: {e}",
                started.elapsed()
            ),
            Err(_) => panic!("client {i} of {CLIENTS} not served within {CLIENT_BOUND:?}"),
        }
    }
    assert!(evicted(&weir) > 0, "{}", weir.metrics_text());
    attacker.abort_all();
}
