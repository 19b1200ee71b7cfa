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
        }
    }

    pub fn certs(&self) -> &[LoadedCert] {
        &self.certs
    }

    /// The index of the certificate for SNI name `sni`.
    pub fn choose(&self, sni: Option<&str>) -> usize {
        let Some(name) = sni else {
            return self.default;
        };
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if let Some(&i) = self.exact.get(name) {
            return i;
        }
        let parent = name.split_once('.').map(|(_, p)| p);
        parent
            .and_then(|p| self.wildcard.get(p).copied())
            .unwrap_or(self.default)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let chosen = self.certs.get(self.choose(hello.server_name()))?;
        Some(chosen.key.clone())
    }
}

#[cfg(test)]
mod tests;
