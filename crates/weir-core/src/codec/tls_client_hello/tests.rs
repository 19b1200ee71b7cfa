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

/// Every strict prefix is Incomplete and the whole is the hello `parse` returns, parsed
/// from scratch and by one [`HelloReader`] fed the prefixes in turn (bytes arriving).
#[track_caller]
fn parse_at_every_split(wire: &[u8]) -> ClientHello {
    let mut reader = HelloReader::default();
    for cut in 0..wire.len() {
        assert_eq!(parse(&wire[..cut]), Ok(Parsed::Incomplete), "prefix {cut}");
        let read = reader.read(&wire[..cut]);
        assert_eq!(read, Ok(Parsed::Incomplete), "reader, prefix {cut}");
    }
    let whole = parse(wire);
    assert_eq!(reader.read(wire), whole, "the reader agrees");
    match whole {
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

/// The attacker review's case: a hello of 1-byte records trickling in one record per read.
/// Each record is joined once (work in proportion to the bytes), where parsing from the
/// start on every read joined each record again for every later one: quadratic, about
/// 270 ms of CPU per connection at the default 16 KiB buffer, seconds at 4 MiB.
#[test]
fn a_reader_joins_each_record_once_however_the_hello_trickles_in() {
    let padding = (21, vec![0; 15_000]);
    let body = body(&[padding, sni_ext(b"a.example.com")]);
    let wire = records(&body, 1);
    let mut reader = HelloReader::default();
    let mut got = Ok(Parsed::Incomplete);
    for end in (6..=wire.len()).step_by(6) {
        assert_eq!(got, Ok(Parsed::Incomplete), "complete before the end");
        got = reader.read(&wire[..end]);
    }
    assert!(matches!(got, Ok(Parsed::Hello(h)) if h.sni() == Some(&b"a.example.com"[..])));
    // The handshake header (4 bytes) and the body, each byte joined once.
    assert_eq!(reader.joined, 4 + body.len());
}

/// RFC 8446 4.2 allows one extension of a type, RFC 6066 3 one name of a type: a second
/// server_name extension or host_name entry is malformed, as OpenSSL and Go answer (Weir
/// routed on the last extension, or the first name, where the server could use another).
#[test]
fn two_server_names_are_malformed() {
    let twice = body(&[sni_ext(b"a.example.com"), sni_ext(b"b.example.com")]);
    assert_eq!(
        parse(&records(&twice, MAX_RECORD)),
        Err(HelloError::Malformed)
    );
    let alpn_twice = body(&[alpn_ext(&[b"h2"]), alpn_ext(&[b"http/1.1"])]);
    assert_eq!(
        parse(&records(&alpn_twice, MAX_RECORD)),
        Err(HelloError::Malformed)
    );
    let (kind, mut two_names) = sni_ext(b"a.example.com");
    let entry = two_names[2..].to_vec();
    two_names.extend_from_slice(&entry);
    let len = (two_names.len() - 2) as u16;
    two_names[..2].copy_from_slice(&len.to_be_bytes());
    let wire = records(&body(&[(kind, two_names.clone())]), MAX_RECORD);
    assert_eq!(parse(&wire), Err(HelloError::Malformed));
    // A name of another type beside the host_name is skipped, as Go does.
    let mut other_type = vec![0, 0, 9, 0, 2, b'x', b'y'];
    other_type.extend_from_slice(&entry);
    let len = (other_type.len() - 2) as u16;
    other_type[..2].copy_from_slice(&len.to_be_bytes());
    let hello = parse_at_every_split(&records(&body(&[(kind, other_type)]), MAX_RECORD));
    assert_eq!(hello.sni(), Some(&b"a.example.com"[..]));
}

/// A name with an empty label is not a host name (bad_sni, as a Host header with one is a
/// 400): `x..b.example.com` must not reach `*.b.example.com`'s upstream. One trailing dot
/// is the root (`a.example.com.` is a name).
#[test]
fn a_server_name_with_an_empty_label_is_no_name() {
    for name in ["x..b.example.com", ".b.example.com", "a.example.com..", "."] {
        let hello = parse_at_every_split(&records(&body(&[sni_ext(name.as_bytes())]), 9));
        assert_eq!(hello.sni(), None, "{name}");
        assert!(hello.bad_sni(), "{name}");
    }
    let rooted = parse_at_every_split(&records(&body(&[sni_ext(b"a.example.com.")]), 9));
    assert_eq!(rooted.sni(), Some(&b"a.example.com."[..]));
}
