//! What a finished handshake settled, kept per connection: version, cipher, SNI and the
//! verified client certificate, plus the client-certificate header line, rendered once
//! and written on every request of the connection.

use rustls::{ProtocolVersion, ServerConnection};

use super::facts::{CertFacts, HEX};
use super::ListenerTls;

/// The TLS facts of one client connection.
#[derive(Debug, Default, Clone)]
pub struct TlsSession {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The IANA cipher suite name, such as `TLS13_AES_128_GCM_SHA256`.
    pub cipher: &'static str,
    /// The SNI name the client sent.
    pub sni: Option<Box<str>>,
    /// An abbreviated handshake: the client resumed an earlier session.
    pub resumed: bool,
    /// ALPN settled on `h2`: the connection speaks HTTP/2 from its first byte.
    pub h2: bool,
    /// The verified client certificate's subject.
    pub client_cert_subject: Option<Box<str>>,
    /// `Name: Hash=...;Subject="..."\r\n` for upstream requests (with a verified client
    /// certificate and `client_cert_header` set).
    pub cert_header_line: Option<Box<[u8]>>,
    /// The client-auth policy the handshake met: a reload that changes the listener's
    /// (`Snapshot::admits`) ends the connection instead of serving it on the new config.
    pub policy: Option<super::setup::ClientPolicy>,
}

impl TlsSession {
    /// The facts of `conn`, a finished handshake on a listener set up as `tls`.
    pub fn new(conn: &ServerConnection, tls: &ListenerTls) -> TlsSession {
        let version = match conn.protocol_version() {
            Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
            Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
            _ => "unknown",
        };
        let cipher = conn
            .negotiated_cipher_suite()
            .and_then(|s| s.suite().as_str())
            .unwrap_or("unknown");
        let peer = conn.peer_certificates();
        TlsSession {
            version,
            cipher,
            resumed: conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
            h2: conn.alpn_protocol() == Some(b"h2"),
            ..TlsSession::with_peer(conn.server_name().map(Box::from), peer, tls)
        }
    }

    /// The facts of a QUIC connection's handshake (always TLS 1.3; quinn does not say
    /// which cipher suite or whether it resumed): the SNI name `sni` and the client's
    /// certificate chain `peer`.
    pub fn quic(
        sni: Option<Box<str>>,
        peer: Option<&[rustls_pki_types::CertificateDer<'_>]>,
        tls: &ListenerTls,
    ) -> TlsSession {
        TlsSession {
            version: "TLSv1.3",
            cipher: "unknown",
            ..TlsSession::with_peer(sni, peer, tls)
        }
    }

    /// The SNI name and what the client certificate `peer` (if any) gives.
    fn with_peer(
        sni: Option<Box<str>>,
        peer: Option<&[rustls_pki_types::CertificateDer<'_>]>,
        tls: &ListenerTls,
    ) -> TlsSession {
        let client = peer
            .and_then(|chain| chain.first())
            .and_then(|der| CertFacts::parse(der).ok());
        let name = tls.client_cert_header.as_deref();
        let cert_header_line = name
            .zip(client.as_ref())
            .map(|(name, facts)| header_line(name, facts));
        TlsSession {
            sni,
            client_cert_subject: client.map(|f| f.subject.into_boxed_str()),
            cert_header_line,
            policy: tls.client_policy.clone(),
            ..TlsSession::default()
        }
    }

    /// The TLS version as a metric label (`1.2`, `1.3`), as an index of `TLS_VERSIONS`.
    pub fn version_index(&self) -> Option<usize> {
        match self.version {
            "TLSv1.2" => Some(0),
            "TLSv1.3" => Some(1),
            _ => None,
        }
    }
}

/// `Name: Hash=<sha256 hex>;Subject="<subject>"\r\n`; in the subject `"` and `\` are
/// escaped with `\` and bytes outside printable ASCII written as `\xHH`, so a certificate
/// cannot break the header.
pub fn header_line(name: &str, facts: &CertFacts) -> Box<[u8]> {
    let mut out = Vec::with_capacity(name.len() + facts.subject.len() + 90);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": Hash=");
    out.extend_from_slice(facts.sha256.as_bytes());
    out.extend_from_slice(b";Subject=\"");
    for &b in facts.subject.as_bytes() {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => {
                out.extend_from_slice(b"\\x");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
    }
    out.extend_from_slice(b"\"\r\n");
    out.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_line_escapes_what_could_break_the_header() {
        let facts = CertFacts {
            names: Vec::new(),
            subject: "CN=a\"b\\c\r\nX: y, O=é".into(),
            issuer: String::new(),
            not_before: 0,
            not_after: 0,
            sha256: "ab".repeat(32),
        };
        let line = header_line("X-Client-Cert", &facts);
        let text = std::str::from_utf8(&line).unwrap();
        assert_eq!(
            text,
            format!(
                "X-Client-Cert: Hash={};Subject=\"CN=a\\\"b\\\\c\\x0d\\x0aX: y, O=\\xc3\\xa9\"\r\n",
                "ab".repeat(32)
            )
        );
    }
}
