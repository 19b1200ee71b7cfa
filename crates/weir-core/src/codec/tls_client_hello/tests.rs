//! ClientHellos built by hand and by rustls, fed whole, at every split point, and
//! fragmented across records.

use super::*;

/// A ClientHello body with the given extensions (type, data).
fn body(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut b = vec![3, 3];
    b.extend_from_slice(&[7; 32]);
    b.push(32);
    b.extend_from_slice(&[9; 32]);
    b.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
    b.extend_from_slice(&[1, 0]);
    let mut ext = Vec::new();
    for (kind, data) in extensions {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(data);
    }
    b.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    b.extend_from_slice(&ext);
    b
}

fn sni_ext(name: &[u8]) -> (u16, Vec<u8>) {
    let mut entry = vec![0];
    entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
    entry.extend_from_slice(name);
    let mut data = (entry.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(&entry);
    (0, data)
}

fn alpn_ext(ids: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for id in ids {
        list.push(id.len() as u8);
        list.extend_from_slice(id);
    }
    let mut data = (list.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    (16, data)
}

/// The handshake message (header + body) in records of at most `fragment` bytes each.
fn records(body: &[u8], fragment: usize) -> Vec<u8> {
    let mut message = vec![1];
    message.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend_from_slice(body);
    let mut out = Vec::new();
    for chunk in message.chunks(fragment) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Every strict prefix is Incomplete and the whole is the hello `parse` returns.
#[track_caller]
fn parse_at_every_split(wire: &[u8]) -> ClientHello {
    for cut in 0..wire.len() {
        assert_eq!(parse(&wire[..cut]), Ok(Parsed::Incomplete), "prefix {cut}");
    }
    match parse(wire) {
        Ok(Parsed::Hello(h)) => h,
        other => panic!("whole hello: {other:?}"),
    }
}

fn example() -> Vec<u8> {
    body(&[
        (10, vec![0, 2, 0, 29]),
        sni_ext(b"A.Example.com"),
        alpn_ext(&[b"h2", b"http/1.1"]),
    ])
}

#[test]
fn sni_and_alpn_at_every_split_point() {
    let hello = parse_at_every_split(&records(&example(), MAX_RECORD));
    assert_eq!(hello.sni(), Some(&b"A.Example.com"[..]));
    let alpn: Vec<&[u8]> = hello.alpn().collect();
    assert_eq!(alpn, vec![&b"h2"[..], b"http/1.1"]);
}

#[test]
fn fragmented_across_records_at_every_split_point() {
    let body = example();
    for fragment in [1, 2, 3, 4, 5, 17, 64] {
        let hello = parse_at_every_split(&records(&body, fragment));
        assert_eq!(
            hello.sni(),
            Some(&b"A.Example.com"[..]),
            "fragment {fragment}"
        );
    }
}

#[test]
fn bytes_after_the_hello_are_ignored() {
    let mut wire = records(&example(), MAX_RECORD);
    wire.extend_from_slice(&[20, 3, 3, 0, 1, 1, 23, 3, 3]);
    assert!(matches!(parse(&wire), Ok(Parsed::Hello(h)) if h.sni().is_some()));
}

#[test]
fn without_sni_or_extensions() {
    let hello = parse_at_every_split(&records(&body(&[alpn_ext(&[b"h2"])]), MAX_RECORD));
    assert_eq!(hello.sni(), None);
    let mut old = body(&[]);
    old.truncate(old.len() - 2); // no extensions block at all
    let hello = parse_at_every_split(&records(&old, MAX_RECORD));
    assert_eq!(hello, ClientHello::default());
}

#[test]
fn not_tls_is_known_from_the_first_bytes() {
    assert_eq!(parse(b"G"), Err(HelloError::NotTls));
    assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(HelloError::NotTls));
    assert_eq!(parse(b"SSH-2.0-OpenSSH"), Err(HelloError::NotTls));
    assert_eq!(
        parse(&[22, 2]),
        Err(HelloError::NotTls),
        "SSLv2-ish version"
    );
}

#[test]
fn malformed_hellos() {
    // Another handshake message first.
    let mut wire = records(&example(), MAX_RECORD);
    wire[5] = 2;
    assert_eq!(parse(&wire), Err(HelloError::Malformed));
    // An empty record and an oversized one.
    assert_eq!(parse(&[22, 3, 1, 0, 0]), Err(HelloError::Malformed));
    assert_eq!(parse(&[22, 3, 1, 0x40, 1]), Err(HelloError::Malformed));
    // An extension longer than the extensions block.
    let mut bad = body(&[sni_ext(b"a.example.com")]);
    // Version, random, session id, suites, compression: 75 bytes; then the block's
    // length (2) and the first extension's type (2) and length (2).
    bad[79] = 0xff;
    assert_eq!(
        parse(&records(&bad, MAX_RECORD)),
        Err(HelloError::Malformed)
    );
    // An empty server name.
    let wire = records(&body(&[sni_ext(b"")]), MAX_RECORD);
    assert_eq!(parse(&wire), Err(HelloError::Malformed));
    // An empty ALPN id.
    let wire = records(&body(&[alpn_ext(&[b""])]), MAX_RECORD);
    assert_eq!(parse(&wire), Err(HelloError::Malformed));
}

/// The first flight of a real rustls client, with SNI and ALPN.
fn rustls_hello(name: &str) -> Vec<u8> {
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("client hello");
    out
}

#[test]
fn a_real_rustls_client_hello_at_every_split_point() {
    let hello = parse_at_every_split(&rustls_hello("a.example.com"));
    assert_eq!(hello.sni(), Some(&b"a.example.com"[..]));
    assert_eq!(hello.alpn().next(), Some(&b"h2"[..]));
}

#[test]
fn an_ip_address_sends_no_sni() {
    let hello = parse_at_every_split(&rustls_hello("127.0.0.1"));
    assert_eq!(hello.sni(), None);
}

#[test]
fn a_server_name_that_is_not_a_host_name_is_no_name_but_the_hello_parses() {
    let long = "a".repeat(MAX_NAME + 1);
    for name in [
        "a.example.com:443",
        "127.0.0.1:8443",
        "[::1]",
        "::1",
        "a/b",
        "a b",
        long.as_str(),
    ] {
        let wire = records(&body(&[sni_ext(name.as_bytes()), alpn_ext(&[b"h2"])]), 7);
        let hello = parse_at_every_split(&wire);
        assert_eq!(hello.sni(), None, "{name}");
        assert!(hello.bad_sni(), "{name}");
        assert_eq!(hello.alpn().next(), Some(&b"h2"[..]), "{name}");
    }
    let good = parse_at_every_split(&records(&example(), MAX_RECORD));
    assert!(!good.bad_sni());
    let none = parse_at_every_split(&records(&body(&[]), MAX_RECORD));
    assert!(!none.bad_sni());
}
