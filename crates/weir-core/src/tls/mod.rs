//! TLS termination on HTTP listeners (rustls on aws-lc-rs, through tokio-rustls).
//!
//! What each part owns:
//! - `pem`: reading a certificate chain and a private key from PEM files;
//! - `facts`: what a certificate says (DNS names, subject, issuer, expiry, SHA-256), for
//!   choosing, listing, metrics and the client-certificate header;
//! - `store`: a listener's certificates, chosen per handshake by SNI (rustls
//!   `ResolvesServerCert`);
//! - `setup`: the listener's rustls `ServerConfig`, built once per config generation and
//!   shared by all workers (session ticket keys and session cache included, so a session
//!   resumes on any worker);
//! - `handshake`: the handshake of an accepted connection, bounded in time and in number
//!   per worker, counted by result and failure reason;
//! - `session`: what the handshake settled, per connection (version, cipher, SNI, client
//!   certificate), for forwarded headers and the access log;
//! - `watch`: reloading certificates whose files changed on disk;
//! - `check`: the certificate report of `weir check`;
//! - `auto`: automatic certificates, from ACME or the internal CA, renewed in the
//!   background and swapped in live.
//!
//! A listener without `[listeners.tls]` never touches this module after accept.

pub mod auto;
pub mod check;
pub mod early_data;
pub mod facts;
pub mod handshake;
pub mod pem;
pub mod session;
mod setup;
pub mod store;
pub mod watch;

use std::path::PathBuf;

pub use setup::ListenerTls;

/// A certificate, key or CA file that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct TlsError {
    pub file: PathBuf,
    pub reason: String,
}

impl TlsError {
    /// `file` is shown absolute: the path that was tried.
    pub(crate) fn new(file: &std::path::Path, reason: impl Into<String>) -> TlsError {
        TlsError {
            file: std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()),
            reason: reason.into(),
        }
    }

    /// How to fix it, by what went wrong (the reasons are this module's own words).
    pub fn fix(&self) -> String {
        let file = self.file.display();
        let reason = self.reason.as_str();
        if reason.contains("No such file") {
            format!(
                "{file} does not exist: correct the path (a relative path starts from the \
                 config file's directory) or put the file there"
            )
        } else if reason.contains("not a regular file") {
            format!("give the path of a regular file: {file} is not one (a FIFO, socket or device would block or never end)")
        } else if reason.contains("the limit for this file") {
            format!("check that {file} is the certificate or key meant: larger files are refused")
        } else if reason.contains("ermission denied") {
            format!("make {file} readable (and its directory searchable) by the user weir runs as")
        } else if reason.contains("PEM") || reason.starts_with("no ") {
            format!("give a PEM file: {file} must hold what its key names, between -----BEGIN and -----END lines")
        } else if reason.contains("does not match") || reason.contains("private key") {
            "give the private key that belongs to this certificate".to_string()
        } else if reason.contains("storage") {
            format!("make {file} a directory weir's user can create and write")
        } else {
            format!("fix or replace {file}")
        }
    }

    /// The key of `tls` (at `at`, such as `listeners[0].tls`) that names this file.
    pub fn field_in(&self, tls: &weir_config::Tls, at: &str) -> String {
        // `self.file` is absolute; the config's paths may not be (text without a file).
        let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let file = self.file.as_path();
        for (i, c) in tls.certs.iter().enumerate() {
            if abs(&c.cert) == file {
                return format!("{at}.certs[{i}].cert");
            }
            if abs(&c.key) == file {
                return format!("{at}.certs[{i}].key");
            }
        }
        if tls.client_auth.as_ref().is_some_and(|a| abs(&a.ca) == file) {
            return format!("{at}.client_auth.ca");
        }
        if let Some(acme) = &tls.acme {
            if acme.directory_ca.as_deref().map(abs).as_deref() == Some(file) {
                return format!("{at}.acme.directory_ca");
            }
            if file.starts_with(abs(&acme.storage)) {
                return format!("{at}.acme.storage");
            }
        }
        if tls
            .internal_ca
            .as_ref()
            .is_some_and(|ca| file.starts_with(abs(&ca.storage)))
        {
            return format!("{at}.internal_ca.storage");
        }
        at.to_string()
    }
}
