//! TLS to upstream servers (`[upstreams.NAME] tls = { ... }`): one rustls `ClientConfig`
//! per upstream per config generation (built with the snapshot, shared by every worker and
//! the health checker, so TLS session resumption works across them), and the handshake
//! after the TCP connect, both within `connect_timeout`.
//!
//! The name sent as SNI and verified is `server_name`, else the server's host as written
//! in `addr` (an IP address is verified against the certificate's IP addresses and sends
//! no SNI). A failed handshake is a [`ProxyError::UpstreamTls`] (502, counted as a connect
//! failure); `connector::connect_server` logs one warning naming the upstream, the server,
//! the name and the reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct};
use rustls::{Error as TlsError, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsConnector;
use weir_config::{Config, PemFile, Upstream, UpstreamProtocol, UpstreamServer, UpstreamTls};

use super::stream::UpstreamStream;
use crate::error::ProxyError;

/// Why an upstream's TLS client could not be built (a load error naming the upstream).
#[derive(Debug, thiserror::Error)]
#[error("upstreams.{upstream}.tls: {reason}")]
pub struct TlsSetupError {
    pub upstream: String,
    pub reason: String,
}

/// The TLS client of one upstream in one config generation.
pub struct TlsUpstream {
    /// Distinguishes this client's connections in the idle pool from plain ones and from
    /// another upstream's (same address, other name or CA).
    pub(crate) pool_id: u64,
    connector: TlsConnector,
    /// `server_name` when configured; otherwise each server's host.
    server_name: Option<ServerName<'static>>,
    /// Without `server_name`: the distinct hosts of the upstream's servers, each verified
    /// by name, so a connection verified for one is never pooled for another (`name_id`).
    hosts: Box<[Box<str>]>,
    /// The settings this was built from (an unchanged upstream keeps its client on reload).
    settings: UpstreamTls,
    /// For HTTP/2 (`protocol = "h2"` or `"auto"`): the same client offering ALPN `h2`
    /// (and `http/1.1` for `auto`), used by `connector::h2`.
    h2: Option<TlsConnector>,
    protocol: UpstreamProtocol,
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The system's CA certificates, read once per process; unreadable ones are skipped.
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system CA certificates");
            }
            let mut store = RootCertStore::empty();
            let (added, ignored) = store.add_parsable_certificates(found.certs);
            tracing::debug!(added, ignored, "system CA certificates for upstream TLS");
            Arc::new(store)
        })
        .clone()
}

impl TlsUpstream {
    /// The TLS client of `upstream` (which has `tls`).
    pub fn build(upstream: &Upstream, tls: &UpstreamTls) -> Result<TlsUpstream, TlsSetupError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let fail = |reason: String| TlsSetupError {
            upstream: upstream.name.clone(),
            reason,
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?;
        let builder = if tls.insecure_skip_verify {
            tracing::warn!(upstream = %upstream.name, "tls.insecure_skip_verify = true: the servers' certificates are NOT verified");
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
        } else {
            builder.with_root_certificates(roots(tls.ca.as_ref()).map_err(fail)?)
        };
        let mut config = match &tls.client_cert {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let chain = CertificateDer::pem_slice_iter(&pair.cert.contents)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| fail(format!("client_cert.cert: {e}")))?;
                let key = PrivateKeyDer::from_pem_slice(&pair.key.contents)
                    .map_err(|e| fail(format!("client_cert.key: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| fail(format!("client_cert: {e}")))?
            }
        };
        // HTTP/1.1 is what the exchange speaks; a server that does ALPN then agrees.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let h2 = match upstream.protocol {
            UpstreamProtocol::H2 => Some(vec![b"h2".to_vec()]),
            UpstreamProtocol::Auto => Some(vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
            UpstreamProtocol::Http1 | UpstreamProtocol::H2c => None,
        }
        .map(|alpn| {
            let mut h2_config = config.clone();
            h2_config.alpn_protocols = alpn;
            TlsConnector::from(Arc::new(h2_config))
        });
        let server_name = match &tls.server_name {
            None => None,
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|e| fail(format!("server_name: {e}")))?,
            ),
        };
        let mut hosts: Vec<Box<str>> = Vec::new();
        if server_name.is_none() {
            for s in &upstream.servers {
                let host = host_of(&s.name);
                if !hosts.iter().any(|h| **h == *host) {
                    hosts.push(host.into());
                }
            }
        }
        Ok(TlsUpstream {
            pool_id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
            hosts: hosts.into(),
            settings: tls.clone(),
            h2,
            protocol: upstream.protocol,
        })
    }

    /// Whether this client was built from exactly `tls` for `protocol` and knows the
    /// host of every server of `upstream` (see `name_id`).
    pub fn is_for(&self, tls: &UpstreamTls, upstream: &Upstream) -> bool {
        self.settings == *tls
            && self.protocol == upstream.protocol
            && (self.server_name.is_some()
                || upstream
                    .servers
                    .iter()
                    .all(|s| self.hosts.iter().any(|h| **h == *host_of(&s.name))))
    }

    /// Which name a connection to `server` is verified for, as a pool key part: 0 when
    /// every server is verified as `server_name`, else 1 + the index of the server's host.
    /// Two servers on one address with different hosts thus never share connections.
    #[inline]
    pub(crate) fn name_id(&self, server: &UpstreamServer) -> u32 {
        if self.hosts.len() <= 1 {
            return self.hosts.len() as u32;
        }
        let host = host_of(&server.name);
        // `is_for` keeps a client only for upstreams whose hosts it knows, so the search
        // finds it; u32::MAX is never shared with a known host.
        self.hosts
            .iter()
            .position(|h| **h == *host)
            .map_or(u32::MAX, |i| i as u32 + 1)
    }

    /// The name to send and verify for `server`.
    fn name_for(&self, server: &UpstreamServer) -> Result<ServerName<'static>, HandshakeError> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = host_of(&server.name);
        ServerName::try_from(host)
            .map(|n| n.to_owned())
            .map_err(|_| HandshakeError::Failed("the server's address is not a valid TLS name"))
    }

    /// The TLS handshake with `server` on `tcp`, finished by `deadline`. On failure the
    /// reason (for a log line or a health-check result).
    pub async fn handshake(
        &self,
        server: &UpstreamServer,
        tcp: TcpStream,
        deadline: Instant,
    ) -> Result<UpstreamStream, HandshakeError> {
        self.handshake_with(&self.connector, server, tcp, deadline)
            .await
    }

    /// As `handshake`, offering ALPN `h2` (the client for `protocol = "h2"` / `"auto"`).
    /// Returns the connection and whether the server chose `h2`.
    pub async fn handshake_h2(
        &self,
        server: &UpstreamServer,
        tcp: TcpStream,
        deadline: Instant,
    ) -> Result<(UpstreamStream, bool), HandshakeError> {
        let connector = self.h2.as_ref().unwrap_or(&self.connector);
        let stream = self
            .handshake_with(connector, server, tcp, deadline)
            .await?;
        let h2 = match &stream {
            UpstreamStream::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
            UpstreamStream::Plain(_) => false,
        };
        Ok((stream, h2))
    }

    async fn handshake_with(
        &self,
        connector: &TlsConnector,
        server: &UpstreamServer,
        tcp: TcpStream,
        deadline: Instant,
    ) -> Result<UpstreamStream, HandshakeError> {
        let name = self.name_for(server)?;
        match timeout_at(deadline, connector.connect(name, tcp)).await {
            Ok(Ok(stream)) => Ok(UpstreamStream::Tls(Box::new(stream))),
            Ok(Err(e)) => Err(HandshakeError::Failed(reason(&e))),
            Err(_) => Err(HandshakeError::Timeout),
        }
    }

    /// The name verified for `server`, for log lines.
    pub fn server_name_shown<'a>(&'a self, server: &'a UpstreamServer) -> &'a str {
        self.settings
            .server_name
            .as_deref()
            .unwrap_or_else(|| host_of(&server.name))
    }
}

/// How a handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Failed(&'static str),
    #[error("TLS handshake not finished within the timeout")]
    Timeout,
}

impl From<HandshakeError> for ProxyError {
    fn from(e: HandshakeError) -> ProxyError {
        match e {
            HandshakeError::Failed(reason) => ProxyError::UpstreamTls(reason),
            HandshakeError::Timeout => ProxyError::UpstreamConnectTimeout,
        }
    }
}

/// The TLS client of every upstream that has `tls` (indexed like `config.upstreams`);
/// `previous` lends its clients to upstreams whose TLS settings did not change, so their
/// pooled connections and TLS sessions carry over a reload.
pub fn build_all(
    config: &Config,
    previous: &[(String, Arc<TlsUpstream>)],
) -> Result<Vec<Option<Arc<TlsUpstream>>>, TlsSetupError> {
    config
        .upstreams
        .iter()
        .map(|u| {
            let Some(tls) = &u.tls else { return Ok(None) };
            let kept = previous
                .iter()
                .find(|(name, t)| *name == u.name && t.is_for(tls, u));
            match kept {
                Some((_, t)) => Ok(Some(t.clone())),
                None => TlsUpstream::build(u, tls).map(|t| Some(Arc::new(t))),
            }
        })
        .collect()
}

/// The CA store: the configured CA file, or the system roots.
pub(crate) fn roots(ca: Option<&PemFile>) -> Result<Arc<RootCertStore>, String> {
    let Some(ca) = ca else {
        return Ok(system_roots());
    };
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca.contents) {
        let cert = cert.map_err(|e| format!("ca: {e}"))?;
        store
            .add(cert)
            .map_err(|e| format!("ca {}: {e}", ca.path.display()))?;
    }
    Ok(Arc::new(store))
}

/// `host` of `host:port` or `[v6]:port`, as written in `addr`.
pub(crate) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// A short, fixed reason for a failed handshake, for the log line and the error.
fn reason(e: &std::io::Error) -> &'static str {
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<TlsError>()) else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection during the handshake"
            }
            std::io::ErrorKind::ConnectionReset => {
                "the server reset the connection during the handshake"
            }
            _ => "I/O error during the handshake",
        };
    };
    match tls {
        TlsError::InvalidCertificate(c) => certificate_reason(c),
        TlsError::AlertReceived(AlertDescription::CertificateRequired) => {
            "the server requires a client certificate"
        }
        TlsError::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => "the server rejected the client certificate",
        TlsError::AlertReceived(AlertDescription::HandshakeFailure)
        | TlsError::PeerIncompatible(_) => "no TLS version or cipher suite in common",
        TlsError::AlertReceived(_) => "the server sent a TLS alert",
        TlsError::NoCertificatesPresented => "the server presented no certificate",
        TlsError::InvalidMessage(_) | TlsError::PeerMisbehaved(_) => {
            "the server is not speaking TLS correctly"
        }
        _ => "TLS error",
    }
}

fn certificate_reason(e: &CertificateError) -> &'static str {
    match e {
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "certificate not valid for name"
        }
        CertificateError::UnknownIssuer => "unknown issuer",
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "certificate expired"
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "certificate not valid yet"
        }
        CertificateError::BadSignature => "bad certificate signature",
        CertificateError::Revoked => "certificate revoked",
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "certificate not for server authentication"
        }
        _ => "invalid certificate",
    }
}

/// `insecure_skip_verify = true`: any certificate is accepted; the handshake signatures
/// are still checked (so the peer holds the key of the certificate it sent).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("api.internal:8443"), "api.internal");
        assert_eq!(host_of("10.0.0.5:8443"), "10.0.0.5");
        assert_eq!(host_of("[::1]:8443"), "::1");
    }

    /// An upstream with TLS (`tls` as written) whose servers are all on 127.0.0.1:8443
    /// but written as `names` (as two DNS names resolving to one address would be).
    fn upstream(tls: &str, names: &[&str]) -> Upstream {
        let mut up = crate::upstream::test_upstream(&format!(
            "servers = [{{ addr = \"127.0.0.1:8443\" }}]\ntls = {tls}\n"
        ));
        let server = up.servers.remove(0);
        up.servers = names
            .iter()
            .map(|n| UpstreamServer {
                name: n.to_string(),
                ..server.clone()
            })
            .collect();
        up
    }

    fn keys(up: &Upstream) -> (Vec<crate::connector::PoolKey>, TlsUpstream) {
        let tls = TlsUpstream::build(up, up.tls.as_ref().unwrap()).unwrap();
        let keys = up
            .servers
            .iter()
            .map(|s| crate::connector::PoolKey::new(s, Some(&tls)))
            .collect();
        (keys, tls)
    }

    #[test]
    fn servers_verified_as_different_names_never_share_pooled_connections() {
        let tls = "{ insecure_skip_verify = true }";
        let up = upstream(tls, &["a.example:8443", "b.example:8443", "a.example:8443"]);
        let (k, client) = keys(&up);
        assert_eq!(k[0].addr, k[1].addr);
        assert_ne!(k[0], k[1], "a.example and b.example share one address");
        assert_eq!(k[0], k[2], "the same name shares");
        assert_ne!(k[0], crate::connector::PoolKey::from(k[0].addr));
        // A reload keeps the client (and its pool) only when it knows every server's name.
        assert!(client.is_for(up.tls.as_ref().unwrap(), &up));
        let more = upstream(tls, &["a.example:8443", "c.example:8443"]);
        assert!(!client.is_for(more.tls.as_ref().unwrap(), &more));
    }

    #[test]
    fn servers_verified_as_one_server_name_share_pooled_connections() {
        let tls = "{ insecure_skip_verify = true, server_name = \"api.example\" }";
        let up = upstream(tls, &["a.example:8443", "b.example:8443"]);
        let (k, client) = keys(&up);
        assert_eq!(k[0], k[1]);
        let more = upstream(tls, &["c.example:8443"]);
        assert!(client.is_for(more.tls.as_ref().unwrap(), &more));
    }
}
