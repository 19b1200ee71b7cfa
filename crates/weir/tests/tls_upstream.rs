//! TLS to upstreams (`[upstreams.NAME] tls = { ... }`) against real rustls backends: an
//! HTTPS backend proxied with its connection reused; SNI and the verified name from
//! `server_name`; wrong CA and name mismatch answered 502 (with one clear log line from the
//! `weir` process); mTLS with and without `client_cert`; `insecure_skip_verify` working and
//! warned about by `weir check`; health checks over TLS; TLS origination on a TCP listener.

mod common;
mod support_process;

use std::path::Path;

use common::{Conf, Weir, WAIT};
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::{wait_until, Backend, BlockingClient, TlsServer};

/// `tls = { ca = "CA" , extra }` as an upstream key line.
fn tls_line(ca: &Path, extra: &str) -> String {
    format!("tls = {{ ca = \"{}\"{extra} }}", ca.display())
}

/// Weir with every request to upstream `up` (the backend), whose keys are `keys`.
fn proxy_to(backend: &Backend, keys: &[&str]) -> Weir {
    Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], keys)
        .start()
}

/// The status of `GET /` through `weir`.
async fn status(weir: &Weir) -> u16 {
    let mut client = weir.client().await;
    client.get("/", "app.test").await.expect("response").status
}

/// A TLS echo backend presenting a certificate for `names` from `ca`.
fn tls_backend(ca: &TestCa, names: &[&str]) -> Backend {
    Backend::echo_tls("tls", &TlsServer::new(&ca.leaf(names)))
}

#[tokio::test]
async fn https_backend_is_proxied_over_one_reused_connection() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let weir = proxy_to(&backend, &[&tls_line(&ca.cert_path, "")]);
    let mut client = weir.client().await;
    for i in 0..3 {
        let response = client
            .get(&format!("/{i}"), "app.test")
            .await
            .expect("response");
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-backend"), Some("tls"));
        assert!(response
            .body_str()
            .starts_with(&format!("GET /{i} HTTP/1.1")));
    }
    assert_eq!(backend.requests_served(), 3);
    assert_eq!(
        backend.connections_accepted(),
        1,
        "one TLS connection, reused"
    );
    // An IP address is verified against the certificate's IP names and sends no SNI.
    assert_eq!(backend.sni_seen(), vec![""]);
}

#[tokio::test]
async fn server_name_is_sent_as_sni_and_verified() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["api.internal"]);
    let extra = ", server_name = \"api.internal\"";
    let weir = proxy_to(&backend, &[&tls_line(&ca.cert_path, extra)]);
    assert_eq!(status(&weir).await, 200);
    assert_eq!(backend.sni_seen(), vec!["api.internal"]);
}

#[tokio::test]
async fn a_name_mismatch_or_an_unknown_issuer_is_a_502() {
    let ca = TestCa::new("upstream CA");
    let other_ca = TestCa::new("someone else's CA");
    let backend = tls_backend(&ca, &["other.internal"]);
    let extra = ", server_name = \"api.internal\"";
    let mismatch = proxy_to(&backend, &[&tls_line(&ca.cert_path, extra)]);
    assert_eq!(status(&mismatch).await, 502);
    let wrong_ca = proxy_to(&backend, &[&tls_line(&other_ca.cert_path, "")]);
    assert_eq!(status(&wrong_ca).await, 502);
    assert_eq!(
        backend.requests_served(),
        0,
        "no request went over a bad connection"
    );
    let metrics = wrong_ca.metrics_text();
    assert!(
        metrics.contains(&format!(
            "weir_upstream_connect_errors_total{{upstream=\"up\",server=\"{}\"}} 1",
            backend.addr()
        )),
        "{metrics}"
    );
}

#[tokio::test]
async fn insecure_skip_verify_accepts_any_certificate() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["not-this-name.test"]);
    let weir = proxy_to(&backend, &["tls = { insecure_skip_verify = true }"]);
    assert_eq!(status(&weir).await, 200);
}

/// A backend requiring a client certificate from `clients` (and its server CA).
fn mtls_backend(clients: &TestCa) -> (TestCa, Backend) {
    let ca = TestCa::new("upstream CA");
    let leaf = ca.leaf(&["127.0.0.1"]);
    let tls = TlsServer::requiring_client_cert(&leaf, &clients.cert_path);
    (ca, Backend::echo_tls("mtls", &tls))
}

fn client_cert(leaf: &Leaf) -> String {
    format!(
        ", client_cert = {{ cert = \"{}\", key = \"{}\" }}",
        leaf.cert_path.display(),
        leaf.key_path.display()
    )
}

#[tokio::test]
async fn client_cert_passes_mtls() {
    let clients = TestCa::new("client CA");
    let (ca, backend) = mtls_backend(&clients);
    let leaf = clients.client("weir");
    let weir = proxy_to(&backend, &[&tls_line(&ca.cert_path, &client_cert(&leaf))]);
    assert_eq!(status(&weir).await, 200);
    assert_eq!(backend.tls_failures(), 0);
}

#[tokio::test]
async fn without_client_cert_mtls_fails_with_a_502() {
    let clients = TestCa::new("client CA");
    let (ca, backend) = mtls_backend(&clients);
    let weir = proxy_to(&backend, &[&tls_line(&ca.cert_path, "")]);
    assert_eq!(status(&weir).await, 502);
    assert!(wait_until(WAIT, || backend.tls_failures() >= 1));
    assert_eq!(backend.requests_served(), 0);
    // A certificate from another CA is refused as well.
    let strangers = TestCa::new("not the client CA");
    let stranger = strangers.client("weir");
    let weir = proxy_to(
        &backend,
        &[&tls_line(&ca.cert_path, &client_cert(&stranger))],
    );
    assert_eq!(status(&weir).await, 502);
    assert_eq!(backend.requests_served(), 0);
}

#[tokio::test]
async fn health_checks_go_over_tls() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let tls = tls_line(&ca.cert_path, "");
    let checks = "[upstreams.up.health_check]\nkind = \"http\"\npath = \"/healthz\"\n\
                  interval = \"50ms\"\ntimeout = \"1s\"";
    let _weir = proxy_to(&backend, &[&tls, checks]);
    // Checks completed TLS handshakes and GETs on the backend; none failed the handshake.
    assert!(wait_until(WAIT, || backend.requests_served() >= 2));
    assert_eq!(backend.tls_failures(), 0);
}

#[tokio::test]
async fn a_health_check_with_the_wrong_ca_marks_the_server_down() {
    let ca = TestCa::new("upstream CA");
    let other_ca = TestCa::new("someone else's CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let tls = tls_line(&other_ca.cert_path, "");
    let checks = "[upstreams.up.health_check]\nkind = \"tcp\"\ninterval = \"50ms\"\n\
                  timeout = \"1s\"\nfall = 1";
    let weir = proxy_to(&backend, &[&tls, checks]);
    let down = "weir_upstream_server_up{upstream=\"up\"";
    assert!(wait_until(WAIT, || {
        let text = weir.metrics_text();
        text.lines()
            .any(|l| l.starts_with(down) && l.ends_with(" 0"))
    }));
    assert_eq!(status(&weir).await, 503);
}

#[tokio::test]
async fn a_tcp_listener_originates_tls() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let weir = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"up\"")
        .upstream("up", &[backend.addr()], &[&tls_line(&ca.cert_path, "")])
        .start();
    // Plain HTTP in, TLS to the backend.
    let mut client = weir.client().await;
    for _ in 0..2 {
        let response = client.get("/", "app.test").await.expect("response");
        assert_eq!(response.header("x-backend"), Some("tls"));
    }
    assert_eq!(backend.connections_accepted(), 1);
    assert_eq!(backend.requests_served(), 2);
}

// ---------------------------------------------------------------- the weir process

#[test]
fn an_unknown_issuer_logs_one_clear_line() {
    let ca = TestCa::new("upstream CA");
    let other_ca = TestCa::new("someone else's CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let rest = format!(
        "[[listeners.routes]]\nname = \"all\"\nupstream = \"api\"\n\n\
         [upstreams.api]\nservers = [{{ addr = \"{}\" }}]\n{}\n",
        backend.addr(),
        tls_line(&other_ca.cert_path, "")
    );
    let weir = support_process::Weir::start(&support_process::config("", "", &rest));
    let mut client = BlockingClient::connect(weir.addr).expect("connect");
    assert_eq!(client.get("/", "app.test").expect("response").status, 502);
    let needle = "upstream TLS handshake failed: unknown issuer";
    assert!(weir.log.wait_for(needle, WAIT), "{}", weir.log.text());
    let lines: Vec<String> = weir
        .log
        .lines()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let server = format!("server={}", backend.addr());
    for part in ["WARN", "upstream=api", &server, "server_name=127.0.0.1"] {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
}

#[test]
fn weir_check_warns_about_insecure_skip_verify() {
    let dir = support_process::TempDir::new("check-tls");
    let rest = "[[listeners.routes]]\nname = \"all\"\nupstream = \"api\"\n\n\
                [upstreams.api]\nservers = [{ addr = \"127.0.0.1:8443\" }]\n\
                tls = { insecure_skip_verify = true }\n";
    let path = dir.write("weir.toml", &support_process::config("", "", rest));
    support_process::assert_check_warns(&path, "upstreams.api.tls.insecure_skip_verify = true");
    let secure = dir.write(
        "secure.toml",
        &support_process::config("", "", &rest.replace("true", "false")),
    );
    let out = support_process::weir_check(&secure);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("WARNING"));
}

#[test]
fn weir_check_rejects_a_client_key_that_is_not_the_certificates() {
    let ca = TestCa::new("client CA");
    let (a, b) = (ca.client("a"), ca.client("b"));
    let dir = support_process::TempDir::new("check-tls-key");
    let rest = format!(
        "[[listeners.routes]]\nname = \"all\"\nupstream = \"api\"\n\n\
         [upstreams.api]\nservers = [{{ addr = \"127.0.0.1:8443\" }}]\n\
         tls = {{ client_cert = {{ cert = \"{}\", key = \"{}\" }} }}\n",
        a.cert_path.display(),
        b.key_path.display()
    );
    let path = dir.write("weir.toml", &support_process::config("", "", &rest));
    let out = support_process::weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a mismatched key must fail the check"
    );
    assert!(
        stderr.contains("upstreams.api.tls: client_cert"),
        "{stderr}"
    );
}

#[tokio::test]
async fn new_upstream_connections_resume_the_tls_session() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    // No pooling: every request opens a new connection, which resumes.
    let weir = proxy_to(&backend, &[&tls_line(&ca.cert_path, ""), "max_idle = 0"]);
    for _ in 0..3 {
        assert_eq!(status(&weir).await, 200);
    }
    assert_eq!(backend.connections_accepted(), 3);
    assert!(
        backend.tls_resumed() >= 2,
        "resumed {} of 3",
        backend.tls_resumed()
    );
}

/// Bodies larger than the socket buffers, both ways over TLS, twice on one connection
/// (writes under backpressure; the body writer flushes what TLS may hold back).
#[tokio::test]
async fn a_large_body_goes_through_tls_whole() {
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let keys = [
        tls_line(&ca.cert_path, ""),
        // Generous: 8 MiB each way through TLS in a debug build takes seconds when the
        // whole suite runs on two cores (5 s cut one run mid-body); a lost flush still
        // fails the test, only later.
        "response_timeout = \"60s\"".into(),
    ];
    let weir = proxy_to(&backend, &[&keys[0], &keys[1]]);
    let body = weir_testkit::pattern_vec(8 << 20);
    let mut client = weir.client().await;
    for _ in 0..2 {
        let response = client
            .request("POST", "/upload", &[], &body)
            .await
            .expect("response");
        assert_eq!(response.status, 200);
        assert!(response.body.ends_with(&body[body.len() - 4096..]));
    }
}

#[test]
fn tls_origination_passes_half_closes_on() {
    use std::io::{Read, Write};
    let ca = TestCa::new("upstream CA");
    let backend = tls_backend(&ca, &["127.0.0.1"]);
    let weir = Conf::new()
        .listener("protocol = \"tcp\"")
        .listener("upstream = \"up\"")
        .upstream("up", &[backend.addr()], &[&tls_line(&ca.cert_path, "")])
        .start();
    let mut client = std::net::TcpStream::connect(weir.addr).expect("connect");
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    client
        .write_all(b"GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    // Client FIN: a close_notify to the backend; the response still comes back, then EOF.
    client
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let mut response = Vec::new();
    client.read_to_end(&mut response).expect("read to EOF");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("GET /bye HTTP/1.1"), "{text}");
}
