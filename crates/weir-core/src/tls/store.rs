//! A listener's certificates and the choice among them by SNI.
//!
//! Each certificate is found under its own DNS names: an exact name beats a wildcard, and
//! `*.example.com` covers exactly one label (`a.example.com`, not `example.com` or
//! `a.b.example.com`). A client without SNI, or with a name no certificate has, gets the
//! default certificate: refusing it would break clients that connect by address.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use weir_config::CertKey;

use super::auto::{challenge, AutoCerts};
use super::facts::CertFacts;
use super::pem::{load_chain, load_key};
use super::TlsError;

/// One loaded certificate: chain and signing key, with its facts.
#[derive(Debug)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    pub facts: CertFacts,
    /// The `cert` file it came from.
    pub file: PathBuf,
}

/// Reads `files`, checking that the key matches the leaf, that the leaf has a DNS name
/// and that it has not expired (`now`: Unix seconds).
pub fn load(files: &CertKey, provider: &CryptoProvider, now: i64) -> Result<LoadedCert, TlsError> {
    let chain = load_chain(&files.cert)?;
    let facts = CertFacts::parse(&chain[0]).map_err(|e| TlsError::new(&files.cert, e))?;
    if facts.names.is_empty() {
        return Err(TlsError::new(
            &files.cert,
            "the certificate has no DNS name (subject alternative name); clients could never match it",
        ));
    }
    if facts.not_after <= now {
        return Err(TlsError::new(
            &files.cert,
            format!(
                "the certificate expired at {}",
                super::facts::format_utc(facts.not_after)
            ),
        ));
    }
    let key = load_key(&files.key)?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::new(
            &files.key,
            format!(
                "the key does not match the certificate {}",
                files.cert.display()
            ),
        ),
        other => TlsError::new(&files.key, format!("unusable private key: {other}")),
    })?;
    Ok(LoadedCert {
        key: Arc::new(certified),
        facts,
        file: files.cert.clone(),
    })
}

/// The certificates of one listener, indexed by name.
#[derive(Debug)]
pub struct CertStore {
    certs: Vec<LoadedCert>,
    /// Exact name -> index into `certs` (the first certificate listed wins a shared name).
    exact: HashMap<Box<str>, usize>,
    /// `*.example.com` stored as `example.com` -> index.
    wildcard: HashMap<Box<str>, usize>,
    default: usize,
    /// The automatic certificate (ACME or internal CA), served for its names unless an
    /// explicit certificate has the exact name.
    auto: Option<Auto>,
}

/// The automatic part of a store.
#[derive(Debug)]
struct Auto {
    certs: Arc<AutoCerts>,
    /// Its names (`*.example.com` stored as `example.com` in `wildcard`).
    exact: HashMap<Box<str>, ()>,
    wildcard: HashMap<Box<str>, ()>,
    /// TLS-ALPN-01 challenges are answered on this listener.
    alpn_challenge: bool,
}

impl CertStore {
    /// A store of `certs` (non-empty); `default` indexes it.
    pub fn new(certs: Vec<LoadedCert>, default: usize) -> CertStore {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for (i, cert) in certs.iter().enumerate() {
            for name in &cert.facts.names {
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.into()).or_insert(i),
                    None => exact.entry(name.as_str().into()).or_insert(i),
                };
            }
        }
        CertStore {
            default: default.min(certs.len().saturating_sub(1)),
            certs,
            exact,
            wildcard,
            auto: None,
        }
    }

    /// Adds the automatic certificate `certs`; `alpn_challenge`: answer TLS-ALPN-01.
    pub fn with_auto(mut self, certs: Arc<AutoCerts>, alpn_challenge: bool) -> CertStore {
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for name in &certs.names {
            match name.strip_prefix("*.") {
                Some(parent) => wildcard.insert(parent.into(), ()),
                None => exact.insert(name.as_str().into(), ()),
            };
        }
        self.auto = Some(Auto {
            certs,
            exact,
            wildcard,
            alpn_challenge,
        });
        self
    }

    /// The automatic certificate source of this store, if it has one.
    pub fn auto(&self) -> Option<&Arc<AutoCerts>> {
        self.auto.as_ref().map(|a| &a.certs)
    }

    pub fn certs(&self) -> &[LoadedCert] {
        &self.certs
    }

    /// The index of the certificate for SNI name `sni`.
    pub fn choose(&self, sni: Option<&str>) -> usize {
        let Some(name) = sni else {
            return self.default;
        };
        let name = normalize(name);
        self.choose_normalized(&name)
    }

    fn choose_normalized(&self, name: &str) -> usize {
        if let Some(&i) = self.exact.get(name) {
            return i;
        }
        let parent = name.split_once('.').map(|(_, p)| p);
        parent
            .and_then(|p| self.wildcard.get(p).copied())
            .unwrap_or(self.default)
    }
}

/// `name` lower-cased, without a trailing dot (allocating only when upper case is sent).
fn normalize(name: &str) -> std::borrow::Cow<'_, str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(name.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

impl Auto {
    fn covers(&self, name: &str) -> bool {
        self.exact.contains_key(name)
            || name
                .split_once('.')
                .is_some_and(|(_, parent)| self.wildcard.contains_key(parent))
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let Some(auto) = &self.auto else {
            let chosen = self.certs.get(self.choose(hello.server_name()))?;
            return Some(chosen.key.clone());
        };
        let sni = hello.server_name().map(normalize);
        if auto.alpn_challenge && hello.alpn().is_some_and(challenge::is_challenge_hello) {
            return challenge::tls_alpn01_cert(sni.as_deref()?);
        }
        // An explicit certificate with the exact name wins; then the automatic one for its
        // names (none yet: the handshake fails, other names are not affected); then the
        // explicit wildcard or default; with no explicit certificate, the automatic one.
        let explicit = match sni.as_deref() {
            Some(name) if self.exact.contains_key(name) => return self.pick(name),
            Some(name) if auto.covers(name) => None,
            Some(name) => Some(self.choose_normalized(name)),
            None => Some(self.default),
        };
        match explicit.and_then(|i| self.certs.get(i)) {
            Some(chosen) => Some(chosen.key.clone()),
            None => auto.certs.current().map(|c| c.key.clone()),
        }
    }
}

impl CertStore {
    fn pick(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        Some(self.certs.get(self.choose_normalized(name))?.key.clone())
    }
}

#[cfg(test)]
mod tests;
