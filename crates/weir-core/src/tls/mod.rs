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
//! - `pending`: the handshakes in progress per worker and listener, under `max_handshakes`
//!   (at the cap the idlest gives its place to a newcomer);
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
pub mod facts;
pub mod handshake;
pub mod pem;
pub mod pending;
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
    pub(crate) fn new(file: &std::path::Path, reason: impl Into<String>) -> TlsError {
        TlsError {
            file: file.to_path_buf(),
            reason: reason.into(),
        }
    }
}
