//! Reading certificate chains and private keys from PEM files (rustls-pki-types), with
//! errors that name the file and say what is wrong with it.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use weir_config::named_file::{self, MAX_FILE_SIZE};

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

/// The bytes of `path`: a regular file of at most [`MAX_FILE_SIZE`] (a FIFO would block the
/// load, `/dev/zero` would fill memory).
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    named_file::read(path, MAX_FILE_SIZE)
        .map_err(|e| TlsError::new(path, format!("cannot read it: {e}")))
}
