//! `weir demo` serves HTTPS from its internal CA, the curl command it prints (CA file,
//! port) works, and a second demo on the same CA storage reuses the CA.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `--cacert FILE` and the port of the `https://localhost:PORT/` the demo printed.
fn printed_https(line: &str) -> Option<(String, u16)> {
    let ca = line.split("--cacert ").nth(1)?.split_whitespace().next()?;
    let port = line.split("https://localhost:").nth(1)?.split('/').next()?;
    Some((ca.to_string(), port.parse().ok()?))
}

#[tokio::test]
async fn demo_serves_https_from_its_internal_ca_and_reuses_it() {
    let dir = weir_testkit::certs::CertDir::new();
    let storage = dir.path().join("ca");
    let ca = demo_https(&storage).await;
    assert_eq!(std::path::Path::new(&ca), storage.join("ca.pem"));
    let first = std::fs::read(&ca).expect("the CA file");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(storage.join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the CA key is private");
    demo_https(&storage).await;
    assert_eq!(
        std::fs::read(&ca).unwrap(),
        first,
        "the restart reused the CA"
    );
}

/// Runs a demo on `storage`, checks its HTTPS URL against the printed CA, stops it; the
/// printed CA file.
async fn demo_https(storage: &std::path::Path) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "demo",
            "--port",
            "0",
            "--tls-port",
            "0",
            "--admin-port",
            "0",
            "--ca-storage",
        ])
        .arg(storage)
        .env("WEIR_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn weir demo");
    let stdout = child.stdout.take().expect("stdout");
    let found = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| printed_https(&l))
    });
    let found = tokio::time::timeout(Duration::from_secs(30), found).await;
    let Ok(Ok(Some((ca, port)))) = found else {
        let _ = child.kill();
        panic!("the demo printed no https URL with --cacert: {found:?}");
    };
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&ca).expect("the printed CA file"))
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake verified against the printed CA");
    tls.write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap();
    let response = String::from_utf8_lossy(&out);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("X-Forwarded-Proto: https"), "{response}");
    terminate(&mut child);
    ca
}

/// SIGTERM, then reap.
fn terminate(child: &mut std::process::Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
}
