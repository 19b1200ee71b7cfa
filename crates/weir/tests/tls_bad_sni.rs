//! Server names that are not host names, as broken clients and scanners send them, on a TLS
//! listener: an IP address is taken as no SNI (the default certificate); a name with a port
//! or in brackets fails the handshake with `illegal_parameter`, counted as `bad_sni` (rustls
//! 0.23 refuses it while reading the ClientHello; docs/tls.md says why Weir cannot ignore
//! it yet). The hellos are a real rustls client's with the name overwritten, in TLS 1.2 so
//! that the certificate the server answers with is in the clear.

mod common;

use std::time::Duration;

use common::{single, tls_table, Weir};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::tls_hello::client_hello_with_sni;
use weir_testkit::Backend;

/// How long the server's first flight may take; only a hang costs it.
const ANSWER: Duration = Duration::from_secs(10);
/// The record of a fatal `illegal_parameter` alert (TLS 1.2).
const ILLEGAL_PARAMETER: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x2f];

/// Sends a ClientHello naming `name` and reads the server's answer until it holds
/// `until`, or the server closes.
async fn answer(weir: &Weir, name: &str, until: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(weir.addr).await.expect("connect");
    tcp.write_all(&client_hello_with_sni(name)).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0; 16 * 1024];
    let read_all = async {
        while !out.windows(until.len()).any(|w| w == until) {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(ANSWER, read_all)
        .await
        .expect("the server answers");
    out
}

fn der(leaf: &Leaf) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("PEM certificate")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn an_ip_address_as_server_name_gets_the_default_certificate() {
    let ca = TestCa::new("bad SNI CA");
    let first = ca.leaf(&["a.example.com"]);
    let default = ca.leaf(&["d.example.com"]);
    let b = Backend::echo("app");
    let extra = format!("default_cert = \"{}\"\n", default.cert_path.display());
    let weir = single(b.addr())
        .listener(&tls_table(&[&first, &default], &extra))
        .start();
    for name in ["127.0.0.1", "::1", "2001:db8::1"] {
        let got = answer(&weir, name, der(&default).as_ref()).await;
        assert!(contains(&got, der(&default).as_ref()), "{name}: {got:?}");
        assert!(!contains(&got, der(&first).as_ref()), "{name}");
    }
    // A well-formed name still picks its certificate (the hello builder is sound).
    let got = answer(&weir, "a.example.com", der(&first).as_ref()).await;
    assert!(contains(&got, der(&first).as_ref()));
}

#[tokio::test]
async fn a_server_name_with_a_port_or_brackets_fails_as_bad_sni() {
    let ca = TestCa::new("bad SNI CA");
    let leaf = ca.leaf(&["a.example.com"]);
    let b = Backend::echo("app");
    let weir = single(b.addr()).listener(&tls_table(&[&leaf], "")).start();
    let names = ["a.example.com:443", "127.0.0.1:8443", "[::1]", "a example"];
    for name in names {
        let got = answer(&weir, name, &ILLEGAL_PARAMETER).await;
        assert!(got.starts_with(&ILLEGAL_PARAMETER), "{name}: {got:?}");
    }
    let series = |reason: &str| {
        format!("weir_tls_handshake_failures_total{{listener=\"web\",reason=\"{reason}\"}}")
    };
    weir.wait_metric(&series("bad_sni"), names.len() as u64)
        .await;
    assert_eq!(weir.metric(&series("other")), 0);
}
