//! The ACME challenges being validated, answered by Weir itself:
//! - HTTP-01: `GET /.well-known/acme-challenge/TOKEN` on any HTTP listener, before
//!   routing, answered with the key authorization;
//! - TLS-ALPN-01: a handshake offering only the `acme-tls/1` ALPN for a name gets a
//!   self-signed certificate carrying the acmeIdentifier extension (RFC 8737).
//!
//! Both tables are read with a lock-free load (ArcSwap) and replaced whole when an order
//! adds or removes an entry, which is rare; requests for other paths only pay a prefix
//! comparison.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

/// The path prefix of HTTP-01 challenges (RFC 8555 section 8.3).
pub const HTTP01_PREFIX: &[u8] = b"/.well-known/acme-challenge/";
/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

type Table<V> = ArcSwap<HashMap<Box<str>, V>>;

fn http01() -> &'static Table<Box<str>> {
    static TOKENS: OnceLock<Table<Box<str>>> = OnceLock::new();
    TOKENS.get_or_init(Default::default)
}

fn tls_alpn01() -> &'static Table<Arc<CertifiedKey>> {
    static CERTS: OnceLock<Table<Arc<CertifiedKey>>> = OnceLock::new();
    CERTS.get_or_init(Default::default)
}

/// The key authorization to answer a request for `path` with, if it is a pending HTTP-01
/// challenge.
#[inline]
pub fn http01_answer(path: &[u8]) -> Option<String> {
    let token = path.strip_prefix(HTTP01_PREFIX)?;
    let token = std::str::from_utf8(token).ok()?;
    http01().load().get(token).map(|k| k.to_string())
}

fn edit<V: Clone>(table: &Table<V>, f: impl Fn(&mut HashMap<Box<str>, V>)) {
    table.rcu(|old| {
        let mut new = HashMap::clone(old);
        f(&mut new);
        new
    });
}

/// Serves `key_authorization` for `token` until [`remove_http01`].
pub fn add_http01(token: &str, key_authorization: &str) {
    edit(http01(), |m| {
        m.insert(token.into(), key_authorization.into());
    });
}

pub fn remove_http01(token: &str) {
    edit(http01(), |m| {
        m.remove(token);
    });
}

/// Serves a TLS-ALPN-01 certificate for `name` proving `key_authorization` (its SHA-256
/// digest goes in the acmeIdentifier extension).
pub fn add_tls_alpn01(name: &str, digest: &[u8]) -> Result<(), String> {
    // rcgen asserts a SHA-256 digest's length; the digest may come from etcd (a fleet).
    if digest.len() != 32 {
        return Err(format!(
            "a TLS-ALPN-01 digest of {} bytes, not 32",
            digest.len()
        ));
    }
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    // Not `CertifiedKey::from_der`: its key check parses the certificate with webpki,
    // which refuses the critical acmeIdentifier extension.
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| e.to_string())?;
    let certified = CertifiedKey::new(vec![CertificateDer::from(cert.der().to_vec())], signing);
    let certified = Arc::new(certified);
    edit(tls_alpn01(), |m| {
        m.insert(name.into(), certified.clone());
    });
    Ok(())
}

pub fn remove_tls_alpn01(name: &str) {
    edit(tls_alpn01(), |m| {
        m.remove(name);
    });
}

/// The challenge certificate for `name`, if one is pending.
pub fn tls_alpn01_cert(name: &str) -> Option<Arc<CertifiedKey>> {
    tls_alpn01().load().get(name).cloned()
}

/// Whether a ClientHello's ALPN list is the TLS-ALPN-01 one (only `acme-tls/1`).
pub fn is_challenge_hello<'a>(mut alpn: impl Iterator<Item = &'a [u8]>) -> bool {
    alpn.next() == Some(ACME_TLS_ALPN) && alpn.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http01_answers_only_pending_tokens_under_the_prefix() {
        add_http01("tok-1", "tok-1.thumb");
        assert_eq!(
            http01_answer(b"/.well-known/acme-challenge/tok-1").as_deref(),
            Some("tok-1.thumb")
        );
        assert_eq!(http01_answer(b"/.well-known/acme-challenge/tok-2"), None);
        assert_eq!(http01_answer(b"/tok-1"), None);
        remove_http01("tok-1");
        assert_eq!(http01_answer(b"/.well-known/acme-challenge/tok-1"), None);
    }

    #[test]
    fn challenge_hello_offers_only_acme_tls() {
        assert!(is_challenge_hello([ACME_TLS_ALPN].into_iter()));
        assert!(!is_challenge_hello([&b"h2"[..], ACME_TLS_ALPN].into_iter()));
        assert!(!is_challenge_hello(std::iter::empty()));
    }
}
