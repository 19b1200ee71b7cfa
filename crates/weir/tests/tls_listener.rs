//! TLS termination on an HTTP listener, with a real rustls client: certificate choice by
//! SNI, versions, ALPN, resumption across workers, client certificates, plain HTTP to the
//! TLS port, and the forwarded headers behind TLS.

mod common;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use common::{single, tls_table, Conf, Weir, WAIT};
use rustls::client::{ClientSessionMemoryCache, Resumption, Tls12Resumption};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore, SupportedProtocolVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::Backend;

const TLS12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];
const TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// A client config trusting `ca`, speaking `versions`, offering `http/1.1`, with an
/// optional client certificate.
fn client_config(
    ca: &TestCa,
    versions: &[&'static SupportedProtocolVersion],
    client_cert: Option<&Leaf>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(der(&ca.cert_pem)).expect("CA certificate");
    let builder =
        ClientConfig::builder_with_protocol_versions(versions).with_root_certificates(roots);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            let chain = vec![der(&leaf.cert_pem)];
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate")
}

async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    name: &str,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_string()).expect("server name");
    TlsConnector::from(config).connect(name, tcp).await
}

/// Sends `GET /` with `Connection: close` and `extra` header lines; the whole response.
async fn get(stream: &mut TlsStream<TcpStream>, extra: &str) -> io::Result<String> {
    let request = format!("GET / HTTP/1.1\r\nHost: site.test\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The leaf certificate the server presented.
fn presented(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("server certificates");
    certs[0].clone().into_owned()
}

/// Waits until the metrics contain `line` (counters are written after the connection ends).
async fn wait_metric(weir: &Weir, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = weir.metrics_text();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{line}` in:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn certificate_is_chosen_by_sni_among_three_with_a_wildcard_and_without_sni() {
    let ca = TestCa::new("SNI CA");
    let a = ca.leaf(&["a.example.com"]);
    let wild = ca.leaf(&["*.example.net"]);
    let c = ca.leaf(&["c.example.org"]);
    let default = format!("default_cert = \"{}\"\n", c.cert_path.display());
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener(&tls_table(&[&a, &wild, &c], &default))
        .start();
    let config = client_config(&ca, TLS13, None);
    for (name, leaf) in [
        ("a.example.com", &a),
        ("x.example.net", &wild),
        ("c.example.org", &c),
    ] {
        let mut s = connect(weir.addr, config.clone(), name).await.expect(name);
        assert_eq!(presented(&s), der(&leaf.cert_pem), "certificate for {name}");
        assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
    }
    let mut no_sni = (*config).clone();
    no_sni.enable_sni = false;
    // Without SNI the client still verifies the name it expects: the default's.
    let s = connect(weir.addr, Arc::new(no_sni), "c.example.org")
        .await
        .expect("no SNI");
    assert_eq!(presented(&s), der(&c.cert_pem));
}

#[tokio::test]
async fn tls_1_2_and_1_3_both_work_and_alpn_is_negotiated() {
    let ca = TestCa::new("version CA");
    let leaf = ca.leaf(&["v.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    for (versions, expected) in [
        (TLS12, rustls::ProtocolVersion::TLSv1_2),
        (TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let mut s = connect(
            weir.addr,
            client_config(&ca, versions, None),
            "v.example.com",
        )
        .await
        .expect("handshake");
        let conn = s.get_ref().1;
        assert_eq!(conn.protocol_version(), Some(expected));
        assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        let response = get(&mut s, "").await.expect("response");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    wait_metric(
        &weir,
        "weir_tls_handshakes_total{listener=\"web\",version=\"1.2\",result=\"full\"} 1",
    )
    .await;
    wait_metric(
        &weir,
        "weir_tls_handshakes_total{listener=\"web\",version=\"1.3\",result=\"full\"} 1",
    )
    .await;
}

#[tokio::test]
async fn min_version_1_3_refuses_a_tls_1_2_client() {
    let ca = TestCa::new("version CA");
    let leaf = ca.leaf(&["v.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener(&tls_table(&[&leaf], "min_version = \"1.3\"\n"))
        .start();
    let refused = connect(weir.addr, client_config(&ca, TLS12, None), "v.example.com").await;
    assert!(refused.is_err(), "a TLS 1.2 client must be refused");
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "v.example.com")
        .await
        .expect("TLS 1.3");
    assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
    wait_metric(
        &weir,
        "weir_tls_handshake_failures_total{listener=\"web\",reason=\"no_shared_version\"} 1",
    )
    .await;
}

/// A running Weir started from `toml` with `workers` workers (the common harness runs one).
struct Running(Option<weir_core::Proxy>);

impl Running {
    fn start(toml: &str, workers: usize) -> Running {
        let config = weir_config::parse_str(toml, "test.toml").expect("config");
        Running(Some(
            weir_core::Proxy::start(config, workers).expect("start"),
        ))
    }

    fn proxy(&self) -> &weir_core::Proxy {
        self.0.as_ref().expect("running")
    }

    fn addr(&self) -> SocketAddr {
        self.proxy()
            .listener_addr(common::LISTENER)
            .expect("listener")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.shutdown();
        }
    }
}

#[tokio::test]
async fn sessions_resume_on_either_of_two_workers_by_ticket_and_by_session_id() {
    let ca = TestCa::new("resume CA");
    let leaf = ca.leaf(&["r.example.com"]);
    let b = Backend::echo("app");
    let toml = single(b.addr()).listener(&tls_table(&[&leaf], "")).toml();
    let running = Running::start(&toml, 2);
    let (p, addr) = (running.proxy(), running.addr());
    let slot = p.snapshot().slots.listeners[0].slot;
    // Resumed handshakes seen by each worker: the kernel spreads connections over the two
    // SO_REUSEPORT sockets by their source port, so within a few dozen connections both
    // workers resume sessions whose tickets the other may have issued.
    let resumed_per_worker = |index: usize| -> Vec<u64> {
        p.metrics()
            .shards()
            .iter()
            .map(|s| {
                s.listener(slot)
                    .map_or(0, |m| m.tls_handshakes[index].get())
            })
            .collect()
    };
    // TLS 1.2 both ways: by ticket (rustls' default), and by session ID alone (no ticket
    // extension offered: the server-side session cache must hold the session).
    let by_session_id = {
        let mut config = (*client_config(&ca, TLS12, None)).clone();
        config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(64)))
            .tls12_resumption(Tls12Resumption::SessionIdOnly);
        Arc::new(config)
    };
    for (config, resumed_index) in [
        (client_config(&ca, TLS13, None), 3),
        (client_config(&ca, TLS12, None), 1),
        (by_session_id, 1),
    ] {
        let before = resumed_per_worker(resumed_index);
        let grew = || {
            let now = resumed_per_worker(resumed_index);
            now.len() == 2 && now.iter().zip(&before).all(|(n, b)| n > b)
        };
        let mut first = connect(addr, config.clone(), "r.example.com")
            .await
            .unwrap();
        assert_eq!(
            first.get_ref().1.handshake_kind(),
            Some(HandshakeKind::Full)
        );
        get(&mut first, "").await.unwrap();
        for round in 0..64 {
            let mut s = connect(addr, config.clone(), "r.example.com")
                .await
                .unwrap();
            assert_eq!(
                s.get_ref().1.handshake_kind(),
                Some(HandshakeKind::Resumed),
                "connection {round}"
            );
            assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
            drop(s);
            if grew() {
                break;
            }
        }
        let seen = resumed_per_worker(resumed_index);
        assert!(grew(), "resumed per worker: {before:?} -> {seen:?}");
    }
}

/// An mTLS listener: certificates from `ca` for `m.example.com`, clients from `clients`.
fn mtls(ca: &TestCa, clients: &TestCa, required: bool, backend: SocketAddr) -> (Weir, Leaf) {
    let leaf = ca.leaf(&["m.example.com"]);
    let extra = format!(
        "client_auth = {{ ca = \"{}\", required = {required} }}\nclient_cert_header = \"X-Client-Cert\"\n",
        clients.cert_path.display()
    );
    let weir = single(backend)
        .listener(&tls_table(&[&leaf], &extra))
        .start();
    (weir, leaf)
}

#[tokio::test]
async fn required_client_certificates() {
    let ca = TestCa::new("server CA");
    let clients = TestCa::new("client CA");
    let strangers = TestCa::new("other CA");
    let b = Backend::echo("app");
    let (weir, _leaf) = mtls(&ca, &clients, true, b.addr());
    // No certificate: the handshake fails (in TLS 1.3 the client learns it on its first read).
    let none = async {
        let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "m.example.com").await?;
        get(&mut s, "").await
    };
    let refused = none.await;
    assert!(
        refused.as_ref().map_or(true, |r| !r.contains("200")),
        "{refused:?}"
    );
    // A certificate from another CA fails the same way.
    let mallory = strangers.client("mallory");
    let other = async {
        let mut s = connect(
            weir.addr,
            client_config(&ca, TLS13, Some(&mallory)),
            "m.example.com",
        )
        .await?;
        get(&mut s, "").await
    };
    let refused = other.await;
    assert!(
        refused.as_ref().map_or(true, |r| !r.contains("200")),
        "{refused:?}"
    );
    wait_metric(
        &weir,
        "weir_tls_handshake_failures_total{listener=\"web\",reason=\"bad_client_cert\"} 2",
    )
    .await;
    // A good certificate: 200, its facts reach the upstream, a forged copy does not.
    let alice = clients.client("alice");
    let mut s = connect(
        weir.addr,
        client_config(&ca, TLS13, Some(&alice)),
        "m.example.com",
    )
    .await
    .expect("handshake with a client certificate");
    let response = get(
        &mut s,
        "X-Client-Cert: forged\r\nx-client-cert: forged too\r\n",
    )
    .await
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let hash = weir_core::tls::facts::sha256_hex(&der(&alice.cert_pem));
    let expected = format!("X-Client-Cert: Hash={hash};Subject=\"CN=alice\"\r\n");
    assert!(response.contains(&expected), "{response}");
    assert!(
        !response.contains("forged"),
        "client copies must be removed: {response}"
    );
    assert!(
        response.contains("X-Forwarded-Proto: https\r\n"),
        "{response}"
    );
}

#[tokio::test]
async fn optional_client_certificates() {
    let ca = TestCa::new("server CA");
    let clients = TestCa::new("client CA");
    let b = Backend::echo("app");
    let (weir, _leaf) = mtls(&ca, &clients, false, b.addr());
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "m.example.com")
        .await
        .expect("no certificate is fine");
    // Also spelled with underscores, which CGI-style servers read as the same header.
    let forged = "X-Client-Cert: Hash=00;Subject=\"CN=admin\"\r\nX_Client_Cert: CN=admin\r\n";
    let response = get(&mut s, forged).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        !response.to_ascii_lowercase().contains("x-client-cert"),
        "{response}"
    );
    let bob = clients.client("bob");
    let mut s = connect(
        weir.addr,
        client_config(&ca, TLS12, Some(&bob)),
        "m.example.com",
    )
    .await
    .unwrap();
    let response = get(&mut s, "").await.unwrap();
    assert!(response.contains("Subject=\"CN=bob\""), "{response}");
}

/// `client_auth` lines for `ca`'s file, `required`, with the client-certificate header.
fn client_auth(ca: &TestCa, required: bool) -> String {
    format!(
        "client_auth = {{ ca = \"{}\", required = {required} }}\nclient_cert_header = \"X-Client-Cert\"\n",
        ca.cert_path.display()
    )
}

/// A `GET /` on a new connection with `config` (its session store resuming what it can):
/// how the handshake went (`None`: it failed) and the response (empty when refused).
async fn try_get(addr: SocketAddr, config: &Arc<ClientConfig>) -> (Option<HandshakeKind>, String) {
    let Ok(mut s) = connect(addr, config.clone(), "m.example.com").await else {
        return (None, String::new());
    };
    let kind = s.get_ref().1.handshake_kind();
    (kind, get(&mut s, "").await.unwrap_or_default())
}

/// A TLS listener over a backend without client auth (`open`) and the same requiring
/// client certificates (`guarded`), with the CAs and the certificate whose files they
/// name (kept: dropping them removes the files).
struct PolicyChange {
    ca: TestCa,
    _clients: TestCa,
    _leaf: Leaf,
    open: Conf,
    guarded: Conf,
}

impl PolicyChange {
    fn new(b: &Backend) -> PolicyChange {
        let ca = TestCa::new("server CA");
        let clients = TestCa::new("client CA");
        let leaf = ca.leaf(&["m.example.com"]);
        let open = single(b.addr()).listener(&tls_table(&[&leaf], ""));
        let guarded = single(b.addr()).listener(&tls_table(&[&leaf], &client_auth(&clients, true)));
        PolicyChange {
            ca,
            _clients: clients,
            _leaf: leaf,
            open,
            guarded,
        }
    }
}

/// rustls does not verify a client again when it resumes a session: the session brings
/// back the certificate it was made with, or none. So a session made before `client_auth`
/// was turned on must not resume after it (it did, and was served without a certificate),
/// over TLS 1.3 and TLS 1.2 alike; a reload that keeps the policy keeps resumption.
#[tokio::test]
async fn a_session_made_before_client_auth_was_turned_on_does_not_resume() {
    let b = Backend::echo("app");
    // Kept whole: the CA files must outlive the reloads.
    let p = PolicyChange::new(&b);
    for versions in [TLS13, TLS12] {
        let weir = p.open.start();
        let config = client_config(&p.ca, versions, None);
        let (kind, response) = try_get(weir.addr, &config).await;
        assert_eq!(kind, Some(HandshakeKind::Full));
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        // The same policy after a reload: the session resumes.
        weir.apply_text(&p.open.toml()).expect("reload");
        let (kind, response) = try_get(weir.addr, &config).await;
        assert_eq!(kind, Some(HandshakeKind::Resumed), "{versions:?}");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        weir.apply_text(&p.guarded.toml()).expect("reload");
        let (kind, response) = try_get(weir.addr, &config).await;
        assert_ne!(
            kind,
            Some(HandshakeKind::Resumed),
            "{versions:?}: {response}"
        );
        assert!(!response.contains("200"), "{versions:?}: {response}");
    }
    assert_eq!(b.requests_served(), 4);
}

/// Sends `GET /` on a kept-alive connection and reads one response (its head, then the
/// `Content-Length` bytes of its body); empty if the connection closed first.
async fn get_kept(stream: &mut TlsStream<TcpStream>) -> io::Result<String> {
    let request = "GET / HTTP/1.1\r\nHost: site.test\r\n\r\n";
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if out.len() >= end + 4 + length {
                return Ok(text);
            }
        }
        match stream.read(&mut chunk).await? {
            0 => return Ok(String::from_utf8_lossy(&out).into_owned()),
            n => out.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A connection let in under one client-auth policy is not served under another: after
/// the reload that turns `client_auth` on, the next request on a connection made without
/// a certificate closes it unanswered (HTTP/2 and HTTP/3 refuse its streams the same
/// way, `Snapshot::admits`). A reload that keeps the policy keeps the connection.
#[tokio::test]
async fn an_open_connection_is_not_served_past_a_new_client_auth_policy() {
    let b = Backend::echo("app");
    // Kept whole: the CA files must outlive the reloads.
    let p = PolicyChange::new(&b);
    let weir = p.open.start();
    let config = client_config(&p.ca, TLS13, None);
    let mut s = connect(weir.addr, config, "m.example.com").await.unwrap();
    let first = get_kept(&mut s).await.unwrap();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    weir.apply_text(&p.open.toml()).expect("reload");
    let kept = get_kept(&mut s).await.unwrap();
    assert!(kept.starts_with("HTTP/1.1 200"), "the same policy: {kept}");
    weir.apply_text(&p.guarded.toml()).expect("reload");
    let after = get_kept(&mut s).await;
    assert!(
        after.as_ref().is_ok_and(String::is_empty) || after.is_err(),
        "{after:?}"
    );
    assert_eq!(b.requests_served(), 2);
}

/// A backend whose answers vary on the client-certificate field: each body says which
/// `X-Client-Cert` it got (`none` without one), stored for a minute by a shared cache.
async fn cert_varying_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = s.read(&mut chunk).await {
                    head.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let cert = text[..end]
                        .lines()
                        .find_map(|l| l.strip_prefix("X-Client-Cert: "))
                        .unwrap_or("none")
                        .to_string();
                    head.drain(..end + 4);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nVary: X-Client-Cert\r\n\
                         Content-Length: {}\r\n\r\n{cert}",
                        cert.len()
                    );
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A cached response that varies on the client-certificate header goes only to the
/// client whose certificate the upstream saw: the cache matches the field as Weir wrote
/// it upstream (the session's), not as the client sent it (none: alice's answer went to
/// bob, who had no certificate).
#[tokio::test]
async fn a_cached_answer_varying_on_the_client_certificate_goes_to_that_client_only() {
    let ca = TestCa::new("server CA");
    let clients = TestCa::new("client CA");
    let leaf = ca.leaf(&["m.example.com"]);
    let backend = cert_varying_backend().await;
    let weir = Conf::new()
        .route("all", "up", &["cache = { store = \"mem\" }"])
        .upstream("up", &[backend], &[])
        .table("[caches.mem]\nkind = \"memory\"\n")
        .listener(&tls_table(&[&leaf], &client_auth(&clients, false)))
        .start();
    let alice = clients.client("alice");
    let as_alice = client_config(&ca, TLS13, Some(&alice));
    let mut s = connect(weir.addr, as_alice, "m.example.com").await.unwrap();
    let first = get_kept(&mut s).await.unwrap();
    assert!(first.contains("CN=alice"), "{first}");
    let anonymous = client_config(&ca, TLS13, None);
    let mut s = connect(weir.addr, anonymous, "m.example.com")
        .await
        .unwrap();
    let second = get_kept(&mut s).await.unwrap();
    assert!(second.ends_with("none"), "{second}");
    let third = get_kept(&mut s).await.unwrap();
    assert!(
        third.ends_with("none") && third.contains("hit"),
        "now a hit: {third}"
    );
}

/// Replaces the file `path` with `pem` and waits for the watcher's new snapshot.
async fn rewrite(running: &Running, path: &std::path::Path, pem: &str) {
    let before = running.proxy().snapshot();
    std::fs::remove_file(path).unwrap();
    std::fs::write(path, pem).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while Arc::ptr_eq(&before, &running.proxy().snapshot()) {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A session made with a certificate of the old CA does not resume once the CA file
/// (read again when it changes on disk, `cert_check_interval`) names another CA: the
/// client must present its certificate again, and the new CA refuses it. A CA file
/// rewritten with the same certificates is the same policy: sessions keep resuming.
#[tokio::test]
async fn a_session_made_under_an_old_ca_does_not_resume_after_the_ca_file_changes() {
    let ca = TestCa::new("server CA");
    let clients = TestCa::new("client CA");
    let next = TestCa::new("next client CA");
    let leaf = ca.leaf(&["m.example.com"]);
    let b = Backend::echo("app");
    let toml = single(b.addr())
        .listener(&tls_table(&[&leaf], &client_auth(&clients, true)))
        .toml()
        .replace("[server]\n", "[server]\ncert_check_interval = \"20ms\"\n");
    let running = Running::start(&toml, 1);
    let addr = running.addr();
    let alice = clients.client("alice");
    let config = client_config(&ca, TLS13, Some(&alice));
    let (kind, response) = try_get(addr, &config).await;
    assert_eq!(kind, Some(HandshakeKind::Full));
    assert!(response.contains("Subject=\"CN=alice\""), "{response}");
    rewrite(&running, &clients.cert_path, &clients.cert_pem).await;
    let (kind, response) = try_get(addr, &config).await;
    assert_eq!(kind, Some(HandshakeKind::Resumed));
    assert!(response.contains("Subject=\"CN=alice\""), "{response}");
    rewrite(&running, &clients.cert_path, &next.cert_pem).await;
    let (kind, response) = try_get(addr, &config).await;
    assert_ne!(kind, Some(HandshakeKind::Resumed), "{response}");
    assert!(!response.contains("200"), "{response}");
    assert_eq!(b.requests_served(), 2);
}

/// The client-certificate header is Weir's on every bind of the listener: on its plain
/// `http_bind`, over HTTP/1.1 and h2c, a client's copy in any spelling never reaches the
/// upstream (it did: only TLS connections had it removed).
#[tokio::test]
async fn a_forged_client_certificate_header_is_removed_on_the_plain_bind() {
    let ca = TestCa::new("server CA");
    let clients = TestCa::new("client CA");
    let leaf = ca.leaf(&["site.test"]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener("http_bind = \"127.0.0.1:0\"")
        .listener(&tls_table(&[&leaf], &client_auth(&clients, true)))
        .start();
    let plain = http_bind_addr(&weir);
    let mut tcp = TcpStream::connect(plain).await.unwrap();
    let forged = "X-Client-Cert: Hash=00;Subject=\"CN=admin\"\r\nX_Client_Cert: CN=admin\r\n";
    let request =
        format!("GET /x HTTP/1.1\r\nHost: site.test\r\n{forged}Connection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(!response.contains("CN=admin"), "{response}");
    let mut h2 = common::h2c_client(plain).await;
    let fields = [("x-client-cert", "CN=admin"), ("x_client_cert", "CN=admin")];
    let (status, _, body) = common::h2_get(&mut h2, "/y", &fields).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("GET /y "), "{body}");
    assert!(!body.contains("CN=admin"), "{body}");
    assert_eq!(b.requests_served(), 2);
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_closed_and_counted() {
    let ca = TestCa::new("plain CA");
    let leaf = ca.leaf(&["p.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    let mut tcp = TcpStream::connect(weir.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: p.example.com\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    assert!(
        answer.is_empty(),
        "got {:?}",
        String::from_utf8_lossy(&answer)
    );
    wait_metric(
        &weir,
        "weir_tls_handshake_failures_total{listener=\"web\",reason=\"plain_http\"} 1",
    )
    .await;
    assert_eq!(b.requests_served(), 0);
}

#[tokio::test]
async fn upstream_sees_x_forwarded_proto_https_and_plain_listeners_keep_http() {
    let ca = TestCa::new("proto CA");
    let leaf = ca.leaf(&["f.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    let mut s = connect(weir.addr, client_config(&ca, TLS12, None), "f.example.com")
        .await
        .unwrap();
    let response = get(&mut s, "").await.unwrap();
    assert!(
        response.contains("X-Forwarded-Proto: https\r\n"),
        "{response}"
    );
    let plain = Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[b.addr()], &[])
        .start();
    let mut c = plain.client().await;
    let r = c.get("/", "site.test").await.unwrap();
    assert!(r.body_str().contains("X-Forwarded-Proto: http\r\n"));
}

/// A client socket whose first write is sent together with `prefix` (a PROXY header), so
/// the header and the ClientHello arrive in one segment.
struct Prefixed {
    tcp: TcpStream,
    prefix: Vec<u8>,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        if self.prefix.is_empty() {
            return std::pin::Pin::new(&mut self.tcp).poll_write(cx, data);
        }
        let mut all = self.prefix.clone();
        all.extend_from_slice(data);
        let n = std::task::ready!(std::pin::Pin::new(&mut self.tcp).poll_write(cx, &all))?;
        assert_eq!(n, all.len(), "a small first write goes out whole");
        self.prefix.clear();
        std::task::Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_client_hello_that_came_with_the_proxy_header_is_used() {
    let ca = TestCa::new("proxy CA");
    let leaf = ca.leaf(&["pp.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener("proxy_protocol = { accept = true, trusted = [\"127.0.0.1\"] }")
        .listener(&tls_table(&[&leaf], "handshake_timeout = \"5s\"\n"))
        .start();
    let tcp = TcpStream::connect(weir.addr).await.unwrap();
    let io = Prefixed {
        tcp,
        prefix: b"PROXY TCP4 192.0.2.7 127.0.0.1 5555 80\r\n".to_vec(),
    };
    let name = ServerName::try_from("pp.example.com").unwrap();
    let mut s = TlsConnector::from(client_config(&ca, TLS13, None))
        .connect(name, io)
        .await
        .expect("handshake after the PROXY header");
    s.write_all(b"GET / HTTP/1.1\r\nHost: pp.example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    s.flush().await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let response = String::from_utf8_lossy(&out);
    assert!(
        response.contains("X-Forwarded-For: 192.0.2.7\r\n"),
        "{response}"
    );
    assert!(
        response.contains("X-Forwarded-Proto: https\r\n"),
        "{response}"
    );
}

#[tokio::test]
async fn large_bodies_stream_both_ways_over_tls_on_a_kept_alive_connection() {
    let ca = TestCa::new("body CA");
    let leaf = ca.leaf(&["big.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    let mut s = connect(
        weir.addr,
        client_config(&ca, TLS13, None),
        "big.example.com",
    )
    .await
    .unwrap();
    let body = vec![b'x'; 3 * 1024 * 1024];
    for round in 0..2 {
        let head = format!(
            "POST /up HTTP/1.1\r\nHost: big.example.com\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // Write the body while reading the response: the upload streams through Weir.
        let (mut r, mut w) = tokio::io::split(&mut s);
        let send = async {
            w.write_all(head.as_bytes()).await.unwrap();
            w.write_all(&body).await.unwrap();
            // tokio-rustls takes the tail into its buffer when the socket is full: only a
            // flush sends it (without this the upload stalled on a loaded CI machine).
            w.flush().await.unwrap();
        };
        let receive = async {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = r.read(&mut chunk).await.unwrap();
                assert!(n > 0, "round {round}: connection closed early");
                got.extend_from_slice(&chunk[..n]);
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .expect("content-length");
                    if got.len() >= end + 4 + len {
                        return (head, got.len() - end - 4);
                    }
                }
            }
        };
        let ((), (head, len)) = tokio::join!(send, receive);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(len > body.len(), "the echo holds the whole body: {len}");
    }
}

#[tokio::test]
async fn json_access_log_and_metrics_describe_the_tls_session_and_certificates() {
    let ca = TestCa::new("log CA");
    let clients = TestCa::new("log clients");
    let leaf = ca.leaf(&["log.example.com", "*.log.example.net"]);
    let path = ca.dir.path().join("access.log");
    let b = Backend::echo("app");
    let extra = format!(
        "client_auth = {{ ca = \"{}\", required = false }}\n",
        clients.cert_path.display()
    );
    let weir = single(b.addr())
        .listener(&format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            path.display()
        ))
        .listener(&tls_table(&[&leaf], &extra))
        .start();
    let carol = clients.client("carol");
    let mut s = connect(
        weir.addr,
        client_config(&ca, TLS12, Some(&carol)),
        "log.example.com",
    )
    .await
    .unwrap();
    let cipher = s
        .get_ref()
        .1
        .negotiated_cipher_suite()
        .unwrap()
        .suite()
        .as_str()
        .unwrap();
    assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
    let deadline = tokio::time::Instant::now() + WAIT;
    let line = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.ends_with('\n') {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "no access-log line");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let expected = format!(
        "\"tls_version\":\"TLSv1.2\",\"tls_cipher\":\"{cipher}\",\"sni\":\"log.example.com\",\"client_cert_subject\":\"CN=carol\"}}"
    );
    assert!(line.contains(&expected), "{expected} in {line}");
    let not_after = weir_core::tls::facts::CertFacts::parse(&der(&leaf.cert_pem))
        .unwrap()
        .not_after;
    let gauge = format!(
        "weir_tls_certificate_expiry_timestamp_seconds{{listener=\"web\",names=\"log.example.com,*.log.example.net\"}} {not_after}"
    );
    wait_metric(&weir, &gauge).await;
}

/// Replaces the files of `target` with those of `with` (same paths, new contents).
fn overwrite(target: &Leaf, with: &Leaf) {
    std::fs::write(&target.cert_path, &with.chain_pem).unwrap();
    std::fs::write(&target.key_path, &with.key_pem).unwrap();
}

/// The certificate a fresh TLS 1.3 connection to `addr` is presented.
async fn served(addr: SocketAddr, ca: &TestCa, name: &str) -> CertificateDer<'static> {
    let s = connect(addr, client_config(ca, TLS13, None), name)
        .await
        .expect("handshake");
    presented(&s)
}

#[tokio::test]
async fn a_reload_reads_new_certificate_files_and_a_bad_one_keeps_the_old() {
    let ca = TestCa::new("reload CA");
    let leaf = ca.leaf(&["re.example.com"]);
    let b = Backend::echo("app");
    let conf = single(b.addr()).listener(&tls_table(&[&leaf], ""));
    let weir = conf.start();
    assert_eq!(
        served(weir.addr, &ca, "re.example.com").await,
        der(&leaf.cert_pem)
    );
    // Same config, new files: the reload (SIGHUP, admin API) reads them.
    let renewed = ca.leaf(&["re.example.com"]);
    overwrite(&leaf, &renewed);
    weir.apply_text(&conf.toml()).expect("reload");
    assert_eq!(
        served(weir.addr, &ca, "re.example.com").await,
        der(&renewed.cert_pem)
    );
    // A key that does not match: rejected, naming the key file; the renewed one stays.
    let other = ca.leaf(&["re.example.com"]);
    std::fs::write(&leaf.key_path, &other.key_pem).unwrap();
    let err = weir.apply_text(&conf.toml()).expect_err("mismatched key");
    let message = err.to_string();
    assert!(
        message.contains(&leaf.key_path.display().to_string()),
        "{message}"
    );
    assert!(message.contains("does not match"), "{message}");
    // The key that names the file (was the listener's `tls` as `listeners[web].tls`).
    assert_eq!(err.field(), "listeners[0].tls.certs[0].key");
    assert_eq!(
        served(weir.addr, &ca, "re.example.com").await,
        der(&renewed.cert_pem)
    );
}

#[tokio::test]
async fn changed_files_are_picked_up_without_a_reload_and_bad_ones_are_skipped() {
    let ca = TestCa::new("watch CA");
    let leaf = ca.leaf(&["w.example.com"]);
    let b = Backend::echo("app");
    let toml = single(b.addr())
        .listener(&tls_table(&[&leaf], ""))
        .toml()
        .replace("[server]\n", "[server]\ncert_check_interval = \"20ms\"\n");
    let running = Running::start(&toml, 1);
    let addr = running.addr();
    assert_eq!(
        served(addr, &ca, "w.example.com").await,
        der(&leaf.cert_pem)
    );
    // An expired replacement is not taken.
    let expired = ca.leaf_with(
        &["w.example.com"],
        &weir_testkit::certs::LeafOptions {
            not_before_days: -9,
            not_after_days: -1,
            ..Default::default()
        },
    );
    overwrite(&leaf, &expired);
    let current = || running.proxy().snapshot();
    let before = current();
    // Give the watcher several intervals to (wrongly) take it, then check it did not.
    let renewed = ca.leaf(&["w.example.com"]);
    for _ in 0..20 {
        assert_eq!(
            served(addr, &ca, "w.example.com").await,
            der(&leaf.cert_pem)
        );
    }
    assert!(
        std::sync::Arc::ptr_eq(&before, &current()),
        "no new snapshot for a bad file"
    );
    overwrite(&leaf, &renewed);
    wait_served(addr, &ca, "w.example.com", &renewed).await;
}

/// Polls until a fresh handshake to `addr` is presented `leaf`'s certificate.
async fn wait_served(addr: SocketAddr, ca: &TestCa, name: &str, leaf: &Leaf) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while served(addr, ca, name).await != der(&leaf.cert_pem) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The watcher compares the files with what the running certificates were read from, so a
/// change made before its first look, or just after a reload read the files, is not taken
/// for the starting point and missed (it was: the renewed files were never served).
#[tokio::test]
async fn files_changed_right_after_start_or_a_reload_are_picked_up() {
    let ca = TestCa::new("watch-start CA");
    let leaf = ca.leaf(&["s.example.com"]);
    let b = Backend::echo("app");
    // Long enough that the changes below land before the watcher's next look.
    let toml = single(b.addr())
        .listener(&tls_table(&[&leaf], ""))
        .toml()
        .replace("[server]\n", "[server]\ncert_check_interval = \"300ms\"\n");
    let running = Running::start(&toml, 1);
    let addr = running.addr();
    let renewed = ca.leaf(&["s.example.com"]);
    overwrite(&leaf, &renewed);
    wait_served(addr, &ca, "s.example.com", &renewed).await;
    // A reload reads the files; they change again at once.
    let config = weir_config::parse_str(&toml, "reload.toml").expect("config");
    running.proxy().apply(config).expect("reload");
    let again = ca.leaf(&["s.example.com"]);
    overwrite(&leaf, &again);
    wait_served(addr, &ca, "s.example.com", &again).await;
}

#[tokio::test]
async fn an_upgraded_connection_tunnels_over_tls() {
    // A backend that answers 101 and then echoes bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(s.read_u8().await.unwrap());
        }
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            .await
            .unwrap();
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    });
    let ca = TestCa::new("upgrade CA");
    let leaf = ca.leaf(&["ws.example.com"]);
    let weir = single(backend_addr)
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let s = connect(weir.addr, client_config(&ca, TLS13, None), "ws.example.com")
        .await
        .unwrap();
    let (mut r, mut w) = tokio::io::split(s);
    w.write_all(b"GET /ws HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .await
        .unwrap();
    w.flush().await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(r.read_u8().await.unwrap());
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let big = weir_testkit::pattern_vec(300_000);
    let write = async {
        w.write_all(&big).await.unwrap();
        w.flush().await.unwrap();
    };
    let read = async {
        let mut got = vec![0u8; big.len()];
        r.read_exact(&mut got).await.unwrap();
        got
    };
    let ((), got) = tokio::time::timeout(WAIT, async { tokio::join!(write, read) })
        .await
        .expect("the tunnel moves the bytes in time");
    assert!(got == big, "the tunnel changed the bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_a_load_of_new_handshakes_fail_none() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
    let ca = TestCa::new("load CA");
    let leaf = ca.leaf(&["load.example.com"]);
    let b = Backend::echo("app");
    let conf = single(b.addr()).listener(&tls_table(&[&leaf], ""));
    let weir = conf.start();
    let (stop, ok) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU32::new(0)),
    );
    let config = client_config(&ca, TLS13, None);
    let load = {
        let (stop, ok, addr) = (stop.clone(), ok.clone(), weir.addr);
        tokio::spawn(async move {
            let mut failed = Vec::new();
            while !stop.load(Relaxed) {
                let attempt = async {
                    let mut s = connect(addr, config.clone(), "load.example.com").await?;
                    get(&mut s, "").await
                };
                match attempt.await {
                    Ok(r) if r.starts_with("HTTP/1.1 200") => drop(ok.fetch_add(1, Relaxed)),
                    other => failed.push(format!("{other:?}")),
                }
            }
            failed
        })
    };
    for round in 1..=10 {
        overwrite(&leaf, &ca.leaf(&["load.example.com"]));
        weir.apply_text(&conf.toml()).expect("reload");
        // Handshakes keep completing between reloads (and during them).
        let deadline = tokio::time::Instant::now() + WAIT;
        while ok.load(Relaxed) < round * 5 {
            assert!(tokio::time::Instant::now() < deadline, "the load stalled");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    stop.store(true, Relaxed);
    let failed = load.await.unwrap();
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
}

#[tokio::test]
async fn without_session_resumption_every_handshake_is_full() {
    let ca = TestCa::new("no-resume CA");
    let leaf = ca.leaf(&["n.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr())
        .listener(&tls_table(&[&leaf], "session_resumption = false\n"))
        .start();
    for versions in [TLS13, TLS12] {
        let config = client_config(&ca, versions, None);
        for _ in 0..3 {
            let mut s = connect(weir.addr, config.clone(), "n.example.com")
                .await
                .unwrap();
            assert_eq!(s.get_ref().1.handshake_kind(), Some(HandshakeKind::Full));
            assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
        }
    }
}

/// The HTTP/2 preface inside TLS (no ALPN h2) is not served as HTTP/2 with prior knowledge:
/// that path would skip the TLS facts (client-certificate header, X-Forwarded-Proto).
#[tokio::test]
async fn the_http2_preface_inside_tls_is_not_prior_knowledge() {
    let ca = TestCa::new("preface CA");
    let leaf = ca.leaf(&["p.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "p.example.com")
        .await
        .expect("handshake");
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("write the preface");
    s.flush().await.expect("flush the preface");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    assert!(
        out.is_empty() || out.starts_with(b"HTTP/1.1 "),
        "answered as HTTP/2: {out:?}"
    );
    assert_eq!(b.requests_served(), 0);
}

/// The address of the plain-HTTP bind (`http_bind`) of the test listener.
fn http_bind_addr(weir: &Weir) -> SocketAddr {
    let binds = weir.proxy().listener_addrs(common::LISTENER);
    binds
        .iter()
        .find(|b| b.plain_http)
        .unwrap_or_else(|| panic!("no http_bind in {binds:?}"))
        .addr
}

/// One listener, one set of routes, two binds (nginx's `listen 80; listen 443 ssl;`): the
/// TLS bind and the plain `http_bind` reach the same route, each with its own scheme; with
/// `redirect_https` only the plain requests are redirected, over HTTP/1 and h2c alike.
#[tokio::test]
async fn http_bind_serves_the_same_routes_and_redirect_https_redirects_only_it() {
    let ca = TestCa::new("http_bind CA");
    let leaf = ca.leaf(&["site.test"]);
    let b = Backend::echo("app");
    let conf = single(b.addr()).listener("http_bind = \"127.0.0.1:0\"");
    let weir = conf.clone().listener(&tls_table(&[&leaf], "")).start();
    let plain = http_bind_addr(&weir);
    assert_ne!(plain, weir.addr);
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "site.test")
        .await
        .unwrap();
    let response = get(&mut s, "").await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("X-Forwarded-Proto: https\r\n"),
        "{response}"
    );
    let mut c = weir_testkit::Client::connect(plain).await.unwrap();
    let r = c.get("/x", "site.test").await.unwrap();
    assert_eq!(r.status, 200, "the same route over plain HTTP");
    assert!(r.body_str().contains("X-Forwarded-Proto: http\r\n"));
    assert_eq!(b.requests_served(), 2);
    drop(weir);

    let weir = conf
        .listener("redirect_https = true")
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let plain = http_bind_addr(&weir);
    let mut c = weir_testkit::Client::connect(plain).await.unwrap();
    let r = c.get("/x?q=1", "site.test").await.unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://site.test/x?q=1"));
    let mut h2 = common::h2c_client(plain).await;
    let request = http::Request::get("http://site.test/y").body(()).unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(
        response.status(),
        308,
        "h2c on the plain bind is redirected too"
    );
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "site.test")
        .await
        .unwrap();
    let response = get(&mut s, "").await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "HTTPS is served: {response}"
    );
    assert_eq!(b.requests_served(), 3);
}

/// A reload that adds an `http_bind` starts accepting there without touching the TLS
/// bind; one that removes it closes it.
#[tokio::test]
async fn a_reload_adds_and_removes_an_http_bind() {
    let ca = TestCa::new("reload CA");
    let leaf = ca.leaf(&["site.test"]);
    let b = Backend::echo("app");
    let conf = single(b.addr()).listener(&tls_table(&[&leaf], ""));
    let weir = conf.start();
    assert_eq!(weir.proxy().listener_addrs(common::LISTENER).len(), 1);
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let with_plain = single(b.addr())
        .listener(&format!("http_bind = \"127.0.0.1:{port}\""))
        .listener(&tls_table(&[&leaf], ""));
    // The test config binds port 0; pin the TLS bind to the port it got so it is kept.
    let pin = |c: &Conf| {
        c.toml().replace(
            "bind = \"127.0.0.1:0\"",
            &format!("bind = \"{}\"", weir.addr),
        )
    };
    weir.apply_text(&pin(&with_plain)).expect("reload");
    let plain = http_bind_addr(&weir);
    assert_eq!(plain.port(), port);
    let mut c = weir_testkit::Client::connect(plain).await.unwrap();
    assert_eq!(c.get("/", "site.test").await.unwrap().status, 200);
    assert_eq!(
        weir.proxy().listener_addr(common::LISTENER),
        Some(weir.addr)
    );

    weir.apply_text(&pin(&conf)).expect("reload");
    assert_eq!(weir.proxy().listener_addrs(common::LISTENER).len(), 1);
    assert!(
        weir_testkit::wait_until_async(WAIT, || std::net::TcpStream::connect(plain).is_err()).await,
        "the removed http_bind stops accepting"
    );
    let mut s = connect(weir.addr, client_config(&ca, TLS13, None), "site.test")
        .await
        .unwrap();
    assert!(get(&mut s, "").await.unwrap().starts_with("HTTP/1.1 200"));
}
