//! The internal CA (Caddy's `tls internal`): an ECDSA P-256 CA made once in `storage`
//! (`ca.pem`, `ca.key` 0600) and leaf certificates it issues for a listener's names.
//! A restart finds the CA and reuses it: clients told to trust `ca.pem` keep trusting.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use super::storage;
use crate::tls::TlsError;

/// How long the CA itself is valid: ten years.
const CA_DAYS: i64 = 3650;

/// The CA of `dir`, made (and written) when `ca.pem` is not there yet.
fn ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, TlsError> {
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert_path.exists() {
        let read = |p: &Path| {
            let bytes = super::super::pem::read(p)?;
            String::from_utf8(bytes)
                .map_err(|_| TlsError::new(p, "not a valid PEM file: not UTF-8"))
        };
        let key = KeyPair::from_pem(&read(&key_path)?)
            .map_err(|e| TlsError::new(&key_path, format!("not a usable CA key: {e}")))?;
        let pem = read(&cert_path)?;
        check_key_matches(&cert_path, &pem, &key)?;
        return Issuer::from_ca_cert_pem(&pem, key)
            .map_err(|e| TlsError::new(&cert_path, format!("not a usable CA certificate: {e}")));
    }
    let key = KeyPair::generate().map_err(|e| TlsError::new(&key_path, e.to_string()))?;
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| TlsError::new(dir, e.to_string()))?;
    let mut dn = DistinguishedName::new();
    // A serial-like suffix: two machines' CAs are told apart in a trust store.
    let suffix = &crate::tls::facts::sha256_hex(key.public_key_raw())[..8];
    dn.push(DnType::CommonName, format!("Weir internal CA {suffix}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(CA_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::new(&cert_path, e.to_string()))?;
    write_pair(&cert_path, &cert.pem(), &key_path, &key.serialize_pem())?;
    tracing::info!(ca = %cert_path.display(), "internal CA made; clients trust it with this file");
    Ok(Issuer::new(params, key))
}

/// Refuses a `ca.key` that is not the key of `ca.pem` (leaves it issues would not verify).
fn check_key_matches(cert_path: &Path, pem: &str, key: &KeyPair) -> Result<(), TlsError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsError::new(cert_path, format!("not a usable CA certificate: {e}")))?;
    let (_, cert) = X509Certificate::from_der(&der)
        .map_err(|e| TlsError::new(cert_path, format!("not a usable CA certificate: {e}")))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(TlsError::new(
            cert_path,
            "ca.key is not the key of ca.pem: restore the matching ca.key, or remove both \
             to make a new CA (clients must then trust the new ca.pem)",
        ));
    }
    Ok(())
}

/// Makes the CA of `dir` when it has none (a fleet's first instance, before sharing it).
pub(super) fn make_ca(dir: &Path) -> Result<(), TlsError> {
    let _lock = storage::Lock::take_ca(dir)
        .map_err(|e| TlsError::new(dir, format!("cannot lock the storage directory: {e}")))?;
    ca(dir).map(drop)
}

/// Issues a certificate for `names` valid for `lifetime` from the CA in `dir` (made if
/// missing) and writes it (chain: leaf then CA) with its key (0600) under `dir`.
pub fn issue(dir: &Path, names: &[String], lifetime: Duration) -> Result<(), TlsError> {
    // Two threads or processes sharing `dir` must not both make a CA, or interleave writes.
    let _lock = storage::Lock::take_ca(dir)
        .map_err(|e| TlsError::new(dir, format!("cannot lock the storage directory: {e}")))?;
    let issuer = ca(dir)?;
    let (cert_path, key_path) = storage::cert_files(dir, names, super::Source::Internal.label());
    let err = |e: rcgen::Error| TlsError::new(&cert_path, format!("cannot issue: {e}"));
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    // A little back-dated (a minute, a quarter of a short lifetime): clients with a clock
    // slightly behind accept it, and renewal still comes after more than half of it.
    let lifetime = time::Duration::try_from(lifetime).unwrap_or(time::Duration::days(7));
    let quarter: time::Duration = lifetime / 4;
    params.not_before = now - quarter.min(time::Duration::minutes(1));
    params.not_after = now + lifetime;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).unwrap_or_default();
    let chain = format!("{}{ca_pem}", cert.pem());
    write_pair(&cert_path, &chain, &key_path, &key.serialize_pem())
}

fn write_pair(cert: &Path, chain: &str, key: &Path, key_pem: &str) -> Result<(), TlsError> {
    storage::write_pair(cert, chain.as_bytes(), key, key_pem.as_bytes())
        .map_err(|e| TlsError::new(cert, format!("cannot write it and its key: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_key_that_is_not_the_key_of_ca_pem_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("weir-ca-mismatch-{}", std::process::id()));
        let names = vec!["a.test".to_owned()];
        issue(&dir, &names, Duration::from_secs(3600)).unwrap();
        let other = KeyPair::generate().unwrap();
        storage::write(&dir.join("ca.key"), other.serialize_pem().as_bytes(), true).unwrap();
        let error = issue(&dir, &names, Duration::from_secs(3600))
            .unwrap_err()
            .to_string();
        assert!(error.contains("ca.key is not the key of ca.pem"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
