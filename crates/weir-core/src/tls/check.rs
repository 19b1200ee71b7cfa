//! `weir check` for certificates: every TLS listener's files are loaded as a start would
//! (readable, key matches, a DNS name, not expired), then reported with their names,
//! issuer, expiry and fingerprint, with warnings for a chain out of order and for a
//! certificate expiring within [`EXPIRY_WARNING_DAYS`]. Automatic certificates are only
//! looked at: their storage must be usable, and a stored one is reported.

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;
use weir_config::Config;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::facts::{format_utc, unix_now, CertFacts};
use super::ListenerTls;
use crate::snapshot::ListenerTlsError;

/// Certificates expiring sooner than this are warned about.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// One certificate of one listener, as `weir check` reports it.
#[derive(Debug)]
pub struct CertReport {
    pub listener: String,
    pub file: PathBuf,
    pub facts: CertFacts,
    /// Whole days until it expires.
    pub days_left: i64,
    pub warnings: Vec<String>,
}

impl std::fmt::Display for CertReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "listener {:?}: {}: names {}; issuer {}; expires {} (in {} days); sha256 {}",
            self.listener,
            self.file.display(),
            self.facts.names.join(", "),
            self.facts.issuer,
            format_utc(self.facts.not_after),
            self.days_left,
            self.facts.sha256
        )
    }
}

/// Loads and reports every certificate of `config`; the first unusable file is an error.
pub fn check(config: &Config) -> Result<Vec<CertReport>, ListenerTlsError> {
    let now = unix_now();
    let mut reports = Vec::new();
    for (i, listener) in config.listeners.iter().enumerate() {
        let Some(tls) = &listener.tls else { continue };
        let error = |error| ListenerTlsError::new(config, i, error);
        // The files and settings as a start would load them, but without the automatic
        // certificate: obtaining it writes (storage, CA, leaf), and a check writes nothing.
        let mut manual = tls.clone();
        manual.acme = None;
        manual.internal_ca = None;
        let built = ListenerTls::build(&manual, None).map_err(error)?;
        let stored = super::auto::check(tls).map_err(error)?;
        for cert in built.store.certs().iter().chain(stored.as_ref()) {
            let days_left = (cert.facts.not_after - now).div_euclid(86_400);
            let mut warnings: Vec<String> = chain_order(&cert.key.cert).into_iter().collect();
            if days_left < EXPIRY_WARNING_DAYS {
                warnings.push(format!("expires in {days_left} days: renew it"));
            }
            reports.push(CertReport {
                listener: listener.name.clone(),
                file: cert.file.clone(),
                facts: cert.facts.clone(),
                days_left,
                warnings,
            });
        }
    }
    Ok(reports)
}

/// Why the chain is out of order (each certificate must be issued by the next), if it is.
fn chain_order(chain: &[CertificateDer<'_>]) -> Option<String> {
    for (i, pair) in chain.windows(2).enumerate() {
        let (Ok((_, cert)), Ok((_, issuer))) = (
            X509Certificate::from_der(&pair[0]),
            X509Certificate::from_der(&pair[1]),
        ) else {
            return Some(format!(
                "certificate {} or {} of the chain is unreadable",
                i + 1,
                i + 2
            ));
        };
        if cert.issuer() != issuer.subject() {
            return Some(format!(
                "chain out of order: certificate {} ({}) is not issued by the next one ({}); \
                 put the leaf first, then each issuer",
                i + 1,
                cert.subject(),
                issuer.subject()
            ));
        }
    }
    None
}
