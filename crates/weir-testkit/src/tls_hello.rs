//! The first flight of a real rustls client (a TLS 1.2 ClientHello) with any bytes as its
//! server name, even ones no client library lets through (`example.com:443`, `[::1]`), as
//! broken clients and scanners send them.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// A TLS 1.2 ClientHello naming `name` in its SNI. TLS 1.2 so that the server's answer
/// (its certificate included) is in the clear for the test to read. rustls writes the
/// hello for a placeholder host name of the same length, which is then overwritten with
/// `name` (the lengths around it stay right).
pub fn client_hello_with_sni(name: &str) -> Vec<u8> {
    assert!((1..=63).contains(&name.len()), "a name of 1 to 63 bytes");
    let placeholder = "x".repeat(name.len());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("TLS 1.2")
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let server = ServerName::try_from(placeholder.clone()).expect("placeholder name");
    let mut conn = ClientConnection::new(Arc::new(config), server).expect("client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("client hello");
    let at = hello
        .windows(name.len())
        .position(|w| w == placeholder.as_bytes())
        .expect("the placeholder name in the hello");
    hello[at..at + name.len()].copy_from_slice(name.as_bytes());
    hello
}
