//! TLS offload on a TCP listener (`protocol = "tcp"` with `[listeners.tls]`): a rustls
//! client's TLS ends at Weir and the plaintext reaches a plain backend, byte for byte and
//! with half-close passed on; the certificate is chosen by SNI as on HTTP listeners, and
//! `sni_routes` pick the upstream by the name the handshake settled.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use common::{tls_table, Conf, Weir, WAIT};
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::{pattern_vec, wait_until, Backend};

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate")
}

/// A TCP listener terminating TLS with `certs`, `extra` listener lines, relaying to
/// upstream `up` (and `others`, by name).
fn start(certs: &[&Leaf], up: SocketAddr, extra: &[&str], others: &[(&str, SocketAddr)]) -> Weir {
    let mut conf = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"up\"");
    for line in extra {
        conf = conf.listener(line);
    }
    conf = conf
        .listener(&tls_table(certs, ""))
        .upstream("up", &[up], &[]);
    for (name, addr) in others {
        conf = conf.upstream(name, &[*addr], &[]);
    }
    conf.start()
}

async fn connect(addr: SocketAddr, ca: &TestCa, name: &str) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    connect_over(tcp, ca, name).await
}

/// The TLS handshake as `name` over the connected socket `tcp`.
async fn connect_over(tcp: TcpStream, ca: &TestCa, name: &str) -> TlsStream<TcpStream> {
    let mut roots = RootCertStore::empty();
    roots.add(der(&ca.cert_pem)).expect("CA certificate");
    let config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name = ServerName::try_from(name.to_string()).expect("server name");
    TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .unwrap_or_else(|e| panic!("TLS handshake as {name}: {e}"))
}

fn presented(s: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    let certs = s
        .get_ref()
        .1
        .peer_certificates()
        .expect("server certificates");
    certs[0].clone().into_owned()
}

/// A plain TCP server that echoes each connection until the client's FIN, then closes.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let addr = listener.local_addr().expect("echo address");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// A plain TCP server that sends to each connection as fast as it can until it breaks.
async fn flood_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind flood");
    let addr = listener.local_addr().expect("flood address");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let block = vec![7u8; 64 * 1024];
                while s.write_all(&block).await.is_ok() {}
            });
        }
    });
    addr
}

/// `GET /` with `Connection: close` over `s`: the whole response.
async fn get(s: &mut TlsStream<TcpStream>, host: &str) -> String {
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    s.flush().await.expect("flush");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn plaintext_reaches_a_plain_backend_byte_for_byte_with_half_close() {
    let ca = TestCa::new("offload CA");
    let leaf = ca.leaf(&["t.example.com"]);
    let echo = echo_server().await;
    let weir = start(&[&leaf], echo, &[], &[]);
    let mut s = connect(weir.addr, &ca, "t.example.com").await;
    let sent = pattern_vec(1 << 20);
    let (mut r, mut w) = tokio::io::split(&mut s);
    let writer = async {
        w.write_all(&sent).await.expect("write");
        // close_notify: the backend sees FIN, echoes the rest and closes.
        w.shutdown().await.expect("shutdown");
    };
    let mut back = Vec::new();
    let reader = async { r.read_to_end(&mut back).await.expect("read back") };
    tokio::join!(writer, reader);
    assert_eq!(back.len(), sent.len());
    assert!(back == sent, "the echoed bytes differ");
    let metrics = weir.metrics_text();
    let handshake = "weir_tls_handshakes_total{listener=\"web\",version=\"1.3\",result=\"full\"} 1";
    assert!(metrics.contains(handshake), "{metrics}");
    // Plaintext counted both ways.
    for direction in ["in", "out"] {
        let line = format!(
            "weir_bytes_total{{listener=\"web\",direction=\"{direction}\"}} {}",
            sent.len()
        );
        assert!(
            wait_until(WAIT, || weir.metrics_text().contains(&line)),
            "{line} in\n{}",
            weir.metrics_text()
        );
    }
}

#[tokio::test]
async fn the_certificate_is_chosen_by_sni_and_an_http_backend_gets_plain_http() {
    let ca = TestCa::new("offload SNI CA");
    let a = ca.leaf(&["a.example.com"]);
    let wild = ca.leaf(&["*.example.net"]);
    let backend = Backend::echo("plain");
    let weir = start(&[&a, &wild], backend.addr(), &[], &[]);
    for (name, leaf) in [("a.example.com", &a), ("x.example.net", &wild)] {
        let mut s = connect(weir.addr, &ca, name).await;
        assert_eq!(presented(&s), der(&leaf.cert_pem), "certificate for {name}");
        let response = get(&mut s, name).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.contains(&format!("GET / HTTP/1.1\r\nHost: {name}\r\n")),
            "the backend got the request in plaintext: {response}"
        );
    }
    assert_eq!(backend.requests_served(), 2);
}

#[tokio::test]
async fn sni_routes_pick_the_upstream_by_the_terminated_handshakes_name() {
    let ca = TestCa::new("offload routes CA");
    let leaf = ca.leaf(&["a.example.com", "b.example.com"]);
    let fallback = Backend::echo("fallback");
    let b = Backend::echo("b");
    let routes = "sni_routes = [{ hosts = [\"b.example.com\"], upstream = \"b\" }]";
    let weir = start(&[&leaf], fallback.addr(), &[routes], &[("b", b.addr())]);
    for (name, expected) in [("b.example.com", "b"), ("a.example.com", "fallback")] {
        let mut s = connect(weir.addr, &ca, name).await;
        let response = get(&mut s, name).await;
        assert!(
            response.contains(&format!("X-Backend: {expected}\r\n"))
                || response.contains(&format!("x-backend: {expected}\r\n")),
            "{name}: {response}"
        );
    }
    let metrics = weir.metrics_text();
    for result in ["matched", "unknown_sni"] {
        let line = format!("weir_tcp_sni_total{{listener=\"web\",result=\"{result}\"}} 1");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
}

#[tokio::test]
async fn a_client_half_closing_without_close_notify_still_gets_the_answer() {
    let ca = TestCa::new("offload eof CA");
    let leaf = ca.leaf(&["t.example.com"]);
    // Answers only once it has the client's whole stream (its FIN), then closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend = listener.local_addr().expect("backend address");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut all = Vec::new();
        if s.read_to_end(&mut all).await.is_ok() {
            all.extend_from_slice(b" (answered)");
            let _ = s.write_all(&all).await;
        }
    });
    let weir = start(&[&leaf], backend, &[], &[]);
    let mut s = connect(weir.addr, &ca, "t.example.com").await;
    s.write_all(b"last words").await.expect("write");
    s.flush().await.expect("flush");
    // FIN under the TLS session, without close_notify; the reading side stays open.
    s.get_mut().0.shutdown().await.expect("TCP half-close");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no end of the answer");
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "last words (answered)",
        "{read:?}"
    );
}

/// A TLS client reading slowly (see `common::read_slowly`) from a backend that sends as
/// fast as it can, with a 2 s bound: Weir's writes into the client's TLS stream wait for
/// room in the socket, which a slow reader frees a little at a time; the draining queue
/// under the TLS stream is progress, so the relay stays open.
#[tokio::test]
async fn a_slow_tls_reader_is_not_cut_by_idle_timeout() {
    let ca = TestCa::new("offload CA");
    let leaf = ca.leaf(&["t.example.com"]);
    let flood = flood_server().await;
    let weir = start(&[&leaf], flood, &["idle_timeout = \"2s\""], &[]);
    let tcp = common::small_window(weir.addr).await;
    let mut s = connect_over(tcp, &ca, "t.example.com").await;
    let got = common::read_slowly(&mut s).await;
    assert_eq!(weir.tunnel_timeouts(), (0, 0), "after {got} bytes");
}

/// Issue 24 on TCP listeners too: the offload shares the HTTP listeners' handshake places,
/// so at `max_handshakes` a ready client takes the place of a silent connection.
#[tokio::test]
async fn a_silent_connection_gives_its_handshake_place_to_a_ready_client() {
    let ca = TestCa::new("offload evict CA");
    let leaf = ca.leaf(&["t.example.com"]);
    let echo = echo_server().await;
    let weir = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"up\"")
        .listener(&tls_table(&[&leaf], "max_handshakes = 1\n"))
        .upstream("up", &[echo], &[])
        .start();
    let mut silent = TcpStream::connect(weir.addr).await.expect("connect");
    let accepted = || weir.metric_now("weir_connections_active{listener=\"web\"}") == Some(1);
    assert!(
        wait_until(WAIT, accepted),
        "the silent connection holds the place"
    );
    let mut s = connect(weir.addr, &ca, "t.example.com").await;
    s.write_all(b"ping").await.expect("write");
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.expect("echoed");
    assert_eq!(&back, b"ping");
    let mut rest = Vec::new();
    let _ = silent.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "the silent connection was closed");
    let evicted = "weir_tls_handshake_failures_total{listener=\"web\",reason=\"evicted\"}";
    assert!(wait_until(WAIT, || weir.metric_now(evicted) == Some(1)));
}

/// At `max_connections` (below `max_handshakes`), silent connections in their handshake
/// give their place to a ready client, as on HTTP listeners; before, the TCP listener
/// paused and the client waited for a `handshake_timeout` (here a minute).
#[tokio::test]
async fn silent_connections_give_way_to_a_ready_client_at_max_connections() {
    const CAP: usize = 2;
    let ca = TestCa::new("offload cap CA");
    let leaf = ca.leaf(&["t.example.com"]);
    let echo = echo_server().await;
    let weir = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"up\"")
        .listener(&format!("max_connections = {CAP}"))
        .listener(&tls_table(&[&leaf], "handshake_timeout = \"60s\"\n"))
        .upstream("up", &[echo], &[])
        .start();
    let mut silent = Vec::new();
    for _ in 0..CAP {
        silent.push(TcpStream::connect(weir.addr).await.expect("connect"));
    }
    let full = || weir.metric_now("weir_connections_active{listener=\"web\"}") == Some(CAP as u64);
    assert!(
        wait_until(WAIT, full),
        "the silent connections hold the cap"
    );
    let served = async {
        let mut s = connect(weir.addr, &ca, "t.example.com").await;
        s.write_all(b"ping").await.expect("write");
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.expect("echoed");
        back
    };
    let back = tokio::time::timeout(std::time::Duration::from_secs(5), served)
        .await
        .expect("the ready client is served at once");
    assert_eq!(&back, b"ping");
    let evicted = "weir_connections_evicted_total{listener=\"web\"}";
    assert_eq!(weir.metric(evicted), 1, "{}", weir.metrics_text());
}
