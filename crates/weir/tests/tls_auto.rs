//! Automatic certificates from the internal CA, over real sockets: a client trusting only
//! the stored `ca.pem` completes the handshake, the key files are private, a restart
//! reuses the CA and the certificate, a short-lived certificate is renewed and swapped in
//! live, and `/api/v1/certs`'s source says where each certificate comes from.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{single, Weir};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_testkit::certs::CertDir;
use weir_testkit::Backend;

fn start(backend: &Backend, storage: &Path, lifetime: &str) -> Weir {
    single(backend.addr())
        .listener(&format!(
            "[listeners.tls]\ninternal_ca = {{ storage = {:?}, lifetime = \"{lifetime}\" }}",
            storage.display().to_string()
        ))
        .start()
}

/// A handshake as `localhost` trusting only `storage/ca.pem`, a `GET /`; the leaf's DER
/// and the response.
async fn fetch(weir: &Weir, storage: &Path) -> (Vec<u8>, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(storage.join("ca.pem")).expect("ca.pem"))
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake verified against the stored CA");
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap();
    (leaf, String::from_utf8_lossy(&out).into_owned())
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn internal_ca_serves_verified_https_and_a_restart_reuses_it() {
    let backend = Backend::echo("b");
    let dir = CertDir::new();
    let storage = dir.path().join("ca");
    let weir = start(&backend, &storage, "168h");
    let (leaf, response) = fetch(&weir, &storage).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(mode(&storage.join("ca.key")), 0o600);
    let names = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let (_, key) = weir_core::tls::auto::storage::cert_files(&storage, &names, "internal");
    assert_eq!(mode(&key), 0o600);
    let snapshot = weir.proxy().snapshot();
    let auto = snapshot
        .listener_tls("web")
        .unwrap()
        .store
        .auto()
        .cloned()
        .unwrap();
    assert_eq!(auto.source.label(), "internal");
    assert_eq!(auto.names, vec!["localhost", "127.0.0.1"]);
    let ca = std::fs::read(storage.join("ca.pem")).unwrap();
    drop((snapshot, auto, weir));

    let again = start(&backend, &storage, "168h");
    let (leaf_again, _) = fetch(&again, &storage).await;
    assert_eq!(
        std::fs::read(storage.join("ca.pem")).unwrap(),
        ca,
        "CA re-made"
    );
    assert_eq!(
        leaf_again, leaf,
        "a valid stored certificate is reused, not re-issued"
    );
}

#[tokio::test]
async fn internal_certificate_is_renewed_and_swapped_in_live() {
    let backend = Backend::echo("b");
    let dir = CertDir::new();
    let storage = dir.path().join("ca");
    let weir = start(&backend, &storage, "6s");
    let (first, _) = fetch(&weir, &storage).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (now, response) = fetch(&weir, &storage).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        if now != first {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = weir.metrics_text();
    assert!(
        metrics.contains("weir_certificate_next_renewal_timestamp_seconds{listener=\"web\""),
        "{metrics}"
    );
}

/// The leaf presented for `name`, verified against the PEM CA at `ca` (`None`: the
/// handshake failed).
async fn leaf_for(addr: std::net::SocketAddr, ca: &Path, name: &str) -> Option<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca).ok()?).ok()?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let server = ServerName::try_from(name.to_string()).ok()?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await
        .ok()?;
    Some(tls.get_ref().1.peer_certificates()?[0].to_vec())
}

#[tokio::test]
async fn explicit_certificates_win_for_their_names_and_serve_the_rest() {
    let backend = Backend::echo("b");
    let dir = CertDir::new();
    let storage = dir.path().join("ca");
    let files = weir_testkit::certs::TestCa::new("explicit CA");
    let explicit = files.leaf(&["both.test", "only-file.test"]);
    let weir = single(backend.addr())
        .route("hosts", "up", &["hosts = [\"app.test\", \"both.test\"]"])
        .listener(&format!(
            "[listeners.tls]\ncerts = [{{ cert = {:?}, key = {:?} }}]\ninternal_ca = {{ storage = {:?} }}",
            explicit.cert_path.display().to_string(),
            explicit.key_path.display().to_string(),
            storage.display().to_string()
        ))
        .start();
    let internal_ca = storage.join("ca.pem");
    let app = leaf_for(weir.addr, &internal_ca, "app.test").await;
    assert!(
        app.is_some(),
        "the internal certificate serves its own name"
    );
    assert!(
        leaf_for(weir.addr, &files.cert_path, "both.test")
            .await
            .is_some(),
        "the explicit certificate wins for its exact name"
    );
    assert!(leaf_for(weir.addr, &internal_ca, "both.test")
        .await
        .is_none());
    assert!(
        leaf_for(weir.addr, &files.cert_path, "unknown.test")
            .await
            .is_none(),
        "an unknown name gets the default (explicit) certificate, not valid for it"
    );
    let default = leaf_for(weir.addr, &files.cert_path, "only-file.test").await;
    assert!(default.is_some());
}

#[test]
fn an_unusable_storage_directory_is_refused_with_its_path() {
    let dir = CertDir::new();
    let blocker = dir.write("not-a-dir", "a file");
    let toml = format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nhttp_bind = \"off\"\n\
         [listeners.tls]\nacme = {{ domains = [\"a.test\"], storage = {:?} }}\n",
        blocker.join("acme").display().to_string()
    );
    let config = weir_config::parse_str(&toml, "t.toml").expect("valid shape");
    let error = weir_core::Proxy::start(config, 1).err().expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("not-a-dir/acme") && text.contains("storage directory"),
        "{text}"
    );
}

/// The one routing decision answers HTTP/2 clients' token requests too (h2c here: a
/// validation request comes over plain HTTP).
#[tokio::test]
async fn http01_tokens_are_answered_to_http2_clients() {
    use weir_core::tls::auto::challenge;
    challenge::add_http01("weir-test-token-2", "weir-test-token-2.thumbprint");
    let backend = Backend::echo("b");
    let weir = single(backend.addr()).start();
    let mut client = common::h2c_client(weir.addr)
        .await
        .ready()
        .await
        .expect("ready");
    let uri = "http://a.test/.well-known/acme-challenge/weir-test-token-2";
    let head = http::Request::get(uri).body(()).expect("request");
    let (response, _) = client.send_request(head, true).expect("send");
    let (parts, mut body) = response.await.expect("response").into_parts();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        text.extend_from_slice(&chunk.expect("body"));
    }
    challenge::remove_http01("weir-test-token-2");
    assert_eq!(parts.status, 200);
    assert_eq!(text, b"weir-test-token-2.thumbprint");
    assert_eq!(backend.requests_served(), 0, "answered by Weir");
}

#[tokio::test]
async fn http01_tokens_are_answered_before_routing_and_redirect_https() {
    use weir_core::tls::auto::challenge;
    challenge::add_http01("weir-test-token-1", "weir-test-token-1.thumbprint");
    let backend = Backend::echo("b");
    let routed = single(backend.addr()).start();
    let redirecting = common::Conf::new()
        .listener("redirect_https = true")
        .start();
    for weir in [&routed, &redirecting] {
        let mut c = weir.client().await;
        let r = c
            .get("/.well-known/acme-challenge/weir-test-token-1", "a.test")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), "weir-test-token-1.thumbprint");
    }
    // A token Weir did not put up is an ordinary request: routed, or redirected.
    let mut c = routed.client().await;
    let r = c
        .get("/.well-known/acme-challenge/other", "a.test")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        backend.requests_served(),
        1,
        "only the unknown token reached the backend"
    );
    let mut c = redirecting.client().await;
    let r = c
        .get("/.well-known/acme-challenge/other", "a.test")
        .await
        .unwrap();
    assert_eq!(r.status, 308);
    challenge::remove_http01("weir-test-token-1");
    let r = c
        .get("/.well-known/acme-challenge/weir-test-token-1", "a.test")
        .await
        .unwrap();
    assert_eq!(r.status, 308, "a removed token is no longer answered");
}

/// With `alpn = []` and TLS-ALPN-01, a normal client offering h2 and http/1.1 still
/// completes the handshake (no ALPN chosen): `acme-tls/1` is only in the config chosen
/// for a ClientHello offering nothing else, never the listener's own (empty) list.
#[tokio::test]
async fn tls_alpn01_with_empty_alpn_still_serves_clients_offering_alpn() {
    let backend = Backend::echo("b");
    let dir = CertDir::new();
    let files = weir_testkit::certs::TestCa::new("explicit CA");
    let explicit = files.leaf(&["app.test"]);
    let weir = single(backend.addr())
        .listener(&format!(
            "http_bind = \"off\"\n[listeners.tls]\nalpn = []\ncerts = [{{ cert = {:?}, key = {:?} }}]\n\
             acme = {{ domains = [\"acme.test\"], storage = {:?}, \
             directory = \"https://127.0.0.1:1/directory\", challenge = \"tls-alpn-01\" }}",
            explicit.cert_path.display().to_string(),
            explicit.key_path.display().to_string(),
            dir.path().join("acme").display().to_string()
        ))
        .start();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&files.cert_path).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("app.test").unwrap(), tcp)
        .await
        .expect("a client offering ALPN handshakes with alpn = []");
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

/// Was: the certificate status showed `client error (Connect)`; the reason (the ACME
/// server's certificate is not trusted: set `directory_ca`) was only in another log line.
#[tokio::test]
async fn an_untrusted_acme_server_is_reported_with_the_cause_and_the_fix() {
    let backend = Backend::echo("b");
    let ca = weir_testkit::certs::TestCa::new("Untrusted ACME CA");
    let server = weir_testkit::TlsServer::new(&ca.leaf(&["127.0.0.1"]));
    let directory = Backend::echo_tls("acme", &server);
    let dir = CertDir::new();
    let weir = single(backend.addr())
        .listener(&format!(
            "[listeners.tls]\nacme = {{ domains = [\"acme.test\"], storage = {:?}, \
             directory = \"https://{}/directory\", challenge = \"tls-alpn-01\", \
             retry_initial = \"1h\" }}",
            dir.path().join("acme").display().to_string(),
            directory.addr()
        ))
        .start();
    let auto = weir
        .proxy()
        .snapshot()
        .listener_tls("web")
        .and_then(|t| t.store.auto().cloned())
        .expect("an automatic certificate");
    // Generous: only a hang waits this long (the failure comes within a handshake).
    let failed = weir_testkit::wait_until(Duration::from_secs(30), || {
        auto.status().last_error.is_some()
    });
    assert!(failed, "no failure recorded");
    let error = auto.status().last_error.unwrap_or_default();
    assert!(error.contains("UnknownIssuer"), "the cause: {error}");
    assert!(
        error.contains("(fix: ") && error.contains("directory_ca"),
        "the fix: {error}"
    );
}
