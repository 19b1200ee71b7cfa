//! Reading certificate chains and private keys from PEM files (rustls-pki-types), with
//! errors that name the file and say what is wrong with it.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// The certificates in `path`, in file order (a server chain: leaf first).
pub fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(path, format!("not a valid PEM file: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::new(
            path,
            "no certificate in it (expected \"-----BEGIN CERTIFICATE-----\" sections)",
        ));
    }
    Ok(chain)
}

/// The first private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::new(
            path,
            "no private key in it (expected a \"-----BEGIN PRIVATE KEY-----\" section)",
        ),
        other => TlsError::new(path, format!("not a valid PEM file: {other}")),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::new(path, format!("cannot read it: {e}")))
}
