//! SNI routing on a TCP listener (`sni_routes`), TLS passing through untouched: two TLS
//! backends with different certificates and a fallback behind one listener. Clients
//! complete real handshakes with the backend their SNI names (each backend records the SNI
//! it saw); no SNI, an unknown name and non-TLS bytes reach the fallback; a client that
//! sends half a ClientHello is closed after `preread_timeout` without holding up others.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Conf, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::{wait_until, Backend, Client, TlsServer};

struct Setup {
    ca: TestCa,
    a: Backend,
    b: Backend,
    fallback: Backend,
    weir: Weir,
}

/// Backends `a` (a.example.com), `b` (*.b.example.com and deep.y.b.example.com) and `fallback` (fallback.test, plain
/// HTTP echo, so that non-TLS clients get an answer), one TCP listener routing by SNI.
fn setup(extra: &[&str]) -> Setup {
    let ca = TestCa::new("sni test CA");
    let a = Backend::echo_tls("a", &TlsServer::new(&ca.leaf(&["a.example.com"])));
    let b_names = ["*.b.example.com", "deep.y.b.example.com"];
    let b = Backend::echo_tls("b", &TlsServer::new(&ca.leaf(&b_names)));
    let fallback = Backend::echo("fallback");
    let mut conf = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"fallback\"")
        .listener(
            "sni_routes = [{ hosts = [\"a.example.com\"], upstream = \"a\" }, \
             { hosts = [\"*.b.example.com\"], upstream = \"b\" }]",
        );
    for line in extra {
        conf = conf.listener(line);
    }
    let weir = conf
        .upstream("a", &[a.addr()], &[])
        .upstream("b", &[b.addr()], &[])
        .upstream("fallback", &[fallback.addr()], &[])
        .start();
    Setup {
        ca,
        a,
        b,
        fallback,
        weir,
    }
}

/// A TLS request through Weir with SNI `name`: the answering backend's name.
async fn backend_for(s: &Setup, name: &str) -> String {
    let mut client = Client::connect_tls(s.weir.addr, name, &s.ca.cert_path)
        .await
        .unwrap_or_else(|e| panic!("TLS through weir as {name}: {e}"));
    let response = client.get("/", name).await.expect("response");
    assert_eq!(response.status, 200);
    response.header("x-backend").unwrap_or_default().to_string()
}

/// `weir_tcp_sni_total{result}` of the listener is `n`.
#[track_caller]
fn assert_sni_count(s: &Setup, result: &str, n: u64) {
    let metrics = s.weir.metrics_text();
    let line = format!("weir_tcp_sni_total{{listener=\"web\",result=\"{result}\"}} {n}");
    assert!(metrics.contains(&line), "{line}\n{metrics}");
}

#[tokio::test]
async fn sni_picks_the_backend_and_the_handshake_is_end_to_end() {
    let s = setup(&[]);
    assert_eq!(backend_for(&s, "a.example.com").await, "a");
    assert_eq!(backend_for(&s, "x.b.example.com").await, "b");
    assert_eq!(backend_for(&s, "deep.y.b.example.com").await, "b");
    // The backends completed the handshakes themselves, seeing the client's SNI.
    assert_eq!(s.a.sni_seen(), vec!["a.example.com"]);
    assert_eq!(
        s.b.sni_seen(),
        vec!["x.b.example.com", "deep.y.b.example.com"]
    );
    assert_sni_count(&s, "matched", 3);
}

#[tokio::test]
async fn unknown_or_no_sni_goes_to_the_fallback() {
    let s = setup(&[]);
    // The fallback speaks plain HTTP, so a TLS client's handshake there fails: the point
    // is where the bytes went (the fallback's connection count), not the handshake.
    for name in ["other.example.com", "b.example.com", "127.0.0.1"] {
        let before = s.fallback.connections_accepted();
        let result = Client::connect_tls(s.weir.addr, name, &s.ca.cert_path).await;
        assert!(result.is_err(), "{name}: no TLS server at the fallback");
        assert!(
            wait_until(WAIT, || s.fallback.connections_accepted() == before + 1),
            "{name} reached the fallback"
        );
    }
    assert!(s.a.sni_seen().is_empty() && s.b.sni_seen().is_empty());
    assert_sni_count(&s, "unknown_sni", 2);
    assert_sni_count(&s, "no_sni", 1);
}

#[tokio::test]
async fn plain_http_reaches_the_fallback_with_its_first_bytes() {
    let s = setup(&[]);
    let mut client = s.weir.client().await;
    let response = client.get("/hello", "plain.test").await.expect("response");
    assert_eq!(response.header("x-backend"), Some("fallback"));
    // The bytes read to look for a ClientHello were forwarded first, unchanged.
    assert!(response.body_str().starts_with("GET /hello HTTP/1.1\r\n"));
    assert_sni_count(&s, "not_tls", 1);
}

#[tokio::test]
async fn half_a_client_hello_is_closed_at_preread_timeout_and_others_go_on() {
    // 1 s: the served clients' ClientHellos, sent at once, must stay inside it on a
    // loaded machine; only the stalled client waits it out.
    let s = setup(&["preread_timeout = \"1s\""]);
    let addr = s.weir.addr;
    // A handshake record header promising 512 bytes, then silence.
    let stalled = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        c.write_all(&[22, 3, 1, 2, 0, 1]).expect("write");
        let mut buf = [0u8; 16];
        c.read(&mut buf).map(|n| n == 0).unwrap_or(true)
    });
    // Meanwhile, other clients are served.
    for _ in 0..3 {
        assert_eq!(backend_for(&s, "a.example.com").await, "a");
    }
    let closed = tokio::task::spawn_blocking(move || stalled.join().expect("thread"))
        .await
        .expect("join");
    assert!(closed, "the stalled client was closed");
    assert_eq!(s.fallback.connections_accepted(), 0, "and never forwarded");
    assert_sni_count(&s, "timeout", 1);
}

#[tokio::test]
async fn garbage_after_a_record_header_falls_back_without_hurting_others() {
    let s = setup(&[]);
    let mut garbage = vec![22, 3, 1, 0, 40];
    garbage.extend_from_slice(&[0xee; 40]);
    let mut client = s.weir.client().await;
    client.send_raw(&garbage).await.expect("send");
    assert!(
        wait_until(WAIT, || s.fallback.connections_accepted() == 1),
        "malformed ClientHello went to the fallback"
    );
    assert_eq!(backend_for(&s, "a.example.com").await, "a");
    assert_sni_count(&s, "malformed", 1);
}

#[tokio::test]
async fn a_server_name_that_is_not_a_host_name_goes_to_the_fallback_as_bad_sni() {
    let s = setup(&[]);
    let names = ["a.example.com:443", "[::1]", "::1"];
    for (i, name) in names.iter().enumerate() {
        let hello = weir_testkit::tls_hello::client_hello_with_sni(name);
        let mut client = s.weir.client().await;
        client.send_raw(&hello).await.expect("send");
        assert!(
            wait_until(WAIT, || s.fallback.connections_accepted() == i + 1),
            "{name} reached the fallback"
        );
    }
    assert!(s.a.sni_seen().is_empty());
    assert_sni_count(&s, "bad_sni", names.len() as u64);
    assert_sni_count(&s, "malformed", 0);
}

/// The attacker review's lockout: at `max_connections`, connections that have not started
/// relaying (silent, half a PROXY header, a PROXY header and half a ClientHello) give their
/// place to a newcomer, the idlest first, as on HTTP listeners; before, the listener
/// paused and ready clients waited for `preread_timeout` (here a minute) to free a place.
#[tokio::test]
async fn connections_before_their_relay_give_way_to_a_ready_client_at_the_cap() {
    const CAP: usize = 3;
    let s = setup(&[
        &format!("max_connections = {CAP}"),
        "proxy_protocol = { accept = true, trusted = [\"127.0.0.0/8\"] }",
        "preread_timeout = \"60s\"",
    ]);
    let active = "weir_connections_active{listener=\"web\"}";
    let held: [&[u8]; CAP] = [
        b"",
        b"PROXY TCP4 203.0.1",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 5555 443\r\n\x16\x03\x01\x02\x00\x01",
    ];
    let mut silent = Vec::new();
    for (i, bytes) in held.iter().enumerate() {
        let mut c = tokio::net::TcpStream::connect(s.weir.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut c, bytes)
            .await
            .unwrap();
        silent.push(c);
        let accepted = || s.weir.metric_now(active) == Some(i as u64 + 1);
        assert!(weir_testkit::wait_until_async(WAIT, accepted).await);
    }
    // Ready clients, each behind a PROXY header, kept open; the fallback answers their
    // plain HTTP.
    let mut ready = Vec::new();
    for i in 0..CAP {
        let served = async {
            let mut client = s.weir.client().await;
            let header = b"PROXY TCP4 203.0.113.9 192.0.2.1 5555 443\r\n";
            client.send_raw(header).await.expect("header");
            let response = client.get("/", "ready.test").await.expect("response");
            (client, response)
        };
        let (client, response) = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .unwrap_or_else(|_| panic!("ready client {i} not served at once"));
        assert_eq!(response.header("x-backend"), Some("fallback"));
        ready.push(client);
    }
    // Each newcomer took an idle place, never a relaying client's: the first still relays.
    let evicted = "weir_connections_evicted_total{listener=\"web\"}";
    assert_eq!(
        s.weir.metric(evicted),
        CAP as u64,
        "{}",
        s.weir.metrics_text()
    );
    let again = ready[0]
        .get("/", "ready.test")
        .await
        .expect("still relayed");
    assert_eq!(again.header("x-backend"), Some("fallback"));
}
