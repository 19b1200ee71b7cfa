//! Validation of an upstream's `tls = { server_name, ca, client_cert, insecure_skip_verify }`.
//!
//! The PEM files are read here, once per load, and checked to hold what their key needs
//! (certificates, or one private key), so a missing or wrong file is reported with the
//! key's line; the data plane builds its TLS client from the bytes read here.

use std::path::PathBuf;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::{FieldPath, Issue};
use crate::model::{PemCertKey, PemFile, UpstreamTls};
use crate::raw::{RawCertKey, RawUpstreamTls};

pub(super) fn upstream_tls(
    raw: Option<RawUpstreamTls>,
    path: &FieldPath,
) -> Result<Option<UpstreamTls>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    let server_name = match raw.server_name {
        None => None,
        Some(name) => Some(server_name(name, &path.key("server_name"))?),
    };
    let ca = match raw.ca {
        None => None,
        Some(file) => Some(certificates(file, &path.key("ca"))?),
    };
    let client_cert = match raw.client_cert {
        None => None,
        Some(pair) => Some(cert_key(pair, &path.key("client_cert"))?),
    };
    Ok(Some(UpstreamTls {
        server_name,
        ca,
        client_cert,
        insecure_skip_verify: raw.insecure_skip_verify.unwrap_or(false),
    }))
}

/// A DNS name or an IP address.
fn server_name(name: String, path: &FieldPath) -> Result<String, Issue> {
    match ServerName::try_from(name.as_str()) {
        Ok(_) => Ok(name),
        Err(_) => Err(Issue::new(
            path,
            format!("server_name \"{name}\" is not a DNS name or an IP address"),
            "write the name the servers' certificates are issued for, such as \"api.internal\"",
        )),
    }
}

pub(crate) fn cert_key(raw: RawCertKey, path: &FieldPath) -> Result<PemCertKey, Issue> {
    let cert_path = path.key("cert");
    let key_path = path.key("key");
    let fix = r#"write client_cert = { cert = "client.pem", key = "client.key" }"#;
    let cert = raw
        .cert
        .ok_or_else(|| Issue::new(&cert_path, "client_cert has no cert", fix))?;
    let key = raw
        .key
        .ok_or_else(|| Issue::new(&key_path, "client_cert has no key", fix))?;
    let cert = certificates(cert, &cert_path)?;
    let key = read(key, &key_path)?;
    if PrivateKeyDer::from_pem_slice(&key.contents).is_err() {
        return Err(Issue::new(
            &key_path,
            format!("{} holds no PEM private key", key.path.display()),
            "give a PEM file with a PKCS#8, PKCS#1 (RSA) or SEC1 (EC) private key",
        ));
    }
    Ok(PemCertKey { cert, key })
}

/// A PEM file holding at least one certificate, all readable.
pub(crate) fn certificates(file: String, path: &FieldPath) -> Result<PemFile, Issue> {
    let pem = read(file, path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem.contents).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => Err(Issue::new(
            path,
            format!("{} holds no PEM certificate", pem.path.display()),
            "give a PEM file with -----BEGIN CERTIFICATE----- blocks",
        )),
        Err(e) => Err(Issue::new(
            path,
            format!("{}: malformed PEM: {e}", pem.path.display()),
            "give a PEM file with -----BEGIN CERTIFICATE----- blocks",
        )),
    }
}

fn read(file: String, path: &FieldPath) -> Result<PemFile, Issue> {
    let file = PathBuf::from(file);
    match crate::named_file::read(&file, crate::named_file::MAX_FILE_SIZE) {
        Ok(contents) => Ok(PemFile {
            path: file,
            contents,
        }),
        Err(e) => Err(Issue::new(
            path,
            format!("cannot read {}: {e}", file.display()),
            crate::named_file::fix_for(&e).unwrap_or(
                "check the path (relative paths start from the config file's directory) and its permissions",
            ),
        )),
    }
}
