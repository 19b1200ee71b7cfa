//! A listener's TLS setup: its certificates and the rustls `ServerConfig` every worker's
//! handshakes use. Built once per config generation (in the snapshot, behind an `Arc`), so
//! the ticket keys and the session cache are the same on every worker and a session
//! resumes wherever the kernel hands the client's next connection.
//!
//! Across a reload the ticket keys and the session cache carry over only while the
//! client-auth policy stays the same: rustls does not verify a client again when it
//! resumes (the session brings back the certificate, or the absence of one, it was made
//! with), so a session made before `client_auth` was turned on, or before its CA changed,
//! would otherwise get past the new policy.

use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use weir_config::{AcmeChallenge, ClientAuth, Tls, TlsVersion};

use super::facts::unix_now;
use super::pem::load_chain;
use super::store::{load, CertStore};
use super::TlsError;

/// Sessions kept for resumption by session ID (TLS 1.2 clients without ticket support, and
/// TLS 1.3 when tickets are off); about 200 bytes each.
const SESSION_CACHE_SIZE: usize = 16 * 1024;

/// Everything one listener needs to terminate TLS.
#[derive(Debug)]
pub struct ListenerTls {
    pub server_config: Arc<ServerConfig>,
    /// With TLS-ALPN-01: the config for a ClientHello offering only `acme-tls/1` (the ACME
    /// validator), chosen before the handshake. Kept apart so the normal ALPN list never
    /// holds `acme-tls/1`: with `alpn = []` it would be the only protocol, and rustls
    /// would refuse every client offering h2 or http/1.1.
    pub challenge_config: Option<Arc<ServerConfig>>,
    pub store: Arc<CertStore>,
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
    /// The client-certificate header name as configured (client-sent copies are removed
    /// by `forward::request_head`, on every connection of the listener).
    pub client_cert_header: Option<Box<str>>,
    /// The client-auth policy the config was built with (`None`: no `client_auth`).
    pub client_policy: Option<ClientPolicy>,
}

/// What decides which clients a listener admits: whether a certificate is required, and
/// the CA certificates it must chain to (by content, so a CA file rewritten in place is a
/// new policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPolicy {
    pub required: bool,
    /// SHA-256 over the DER CA certificates, in file order.
    pub ca_digest: Box<[u8]>,
}

impl ListenerTls {
    /// Reads the listener's certificate, key and CA files and builds its rustls config.
    /// With `previous` (the same listener before a reload) the ticket keys and session
    /// cache carry over, so clients keep resuming across reloads, unless the client-auth
    /// policy changed: then sessions made under the old one cannot resume.
    pub fn build(tls: &Tls, previous: Option<&ListenerTls>) -> Result<ListenerTls, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let now = unix_now();
        let certs = tls
            .certs
            .iter()
            .map(|files| load(files, &provider, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut store = CertStore::new(certs, tls.default_cert);
        let alpn_challenge = tls
            .acme
            .as_ref()
            .is_some_and(|a| a.challenge == AcmeChallenge::TlsAlpn01);
        if let Some(auto) = super::auto::obtain(tls)? {
            store = store.with_auto(auto, alpn_challenge);
        }
        let store = Arc::new(store);
        let (mut server_config, client_policy) = server_config(tls, provider, store.clone())?;
        let same_policy = |before: &&ListenerTls| before.client_policy == client_policy;
        if let Some(before) = previous
            .filter(|_| tls.session_resumption)
            .filter(same_policy)
        {
            let kept = &before.server_config;
            if kept.ticketer.enabled() {
                server_config.ticketer = kept.ticketer.clone();
                server_config.session_storage = kept.session_storage.clone();
            }
        }
        let challenge_config = alpn_challenge.then(|| {
            let mut config = server_config.clone();
            config.alpn_protocols = vec![super::auto::challenge::ACME_TLS_ALPN.to_vec()];
            Arc::new(config)
        });
        let client_cert_header = tls.client_cert_header.as_deref().map(Box::from);
        Ok(ListenerTls {
            server_config: Arc::new(server_config),
            challenge_config,
            store,
            handshake_timeout: tls.handshake_timeout,
            max_handshakes: tls.max_handshakes,
            client_cert_header,
            client_policy,
        })
    }

    /// Whether every connection must have presented a verified client certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.client_policy.as_ref().is_some_and(|p| p.required)
    }
}

fn server_config(
    tls: &Tls,
    provider: Arc<CryptoProvider>,
    store: Arc<CertStore>,
) -> Result<(ServerConfig, Option<ClientPolicy>), TlsError> {
    let versions: &[&SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let first_file = match (tls.certs.get(tls.default_cert), &tls.acme, &tls.internal_ca) {
        (Some(files), _, _) => files.cert.as_path(),
        (None, Some(acme), _) => acme.storage.as_path(),
        (None, None, Some(ca)) => ca.storage.as_path(),
        (None, None, None) => std::path::Path::new("-"),
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::new(first_file, format!("cannot set up TLS: {e}")))?;
    let (builder, policy) = match &tls.client_auth {
        None => (builder.with_no_client_auth(), None),
        Some(auth) => {
            let (verifier, policy) = client_verifier(auth, provider)?;
            (builder.with_client_cert_verifier(verifier), Some(policy))
        }
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = tls.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    if tls.session_resumption {
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()
            .map_err(|e| TlsError::new(first_file, format!("cannot make ticket keys: {e}")))?;
        config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_SIZE);
    } else {
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    Ok((config, policy))
}

/// Verifies client certificates against the CAs in `auth.ca`; also the policy it enforces.
fn client_verifier(
    auth: &ClientAuth,
    provider: Arc<CryptoProvider>,
) -> Result<
    (
        Arc<dyn rustls::server::danger::ClientCertVerifier>,
        ClientPolicy,
    ),
    TlsError,
> {
    let mut roots = RootCertStore::empty();
    let mut digest = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for cert in load_chain(&auth.ca)? {
        // Each certificate's length too, so two files never hash alike by splitting
        // the same bytes differently.
        digest.update(&(cert.len() as u64).to_be_bytes());
        digest.update(&cert);
        roots
            .add(cert)
            .map_err(|e| TlsError::new(&auth.ca, format!("not a usable CA certificate: {e}")))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if auth.required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    let verifier = builder
        .build()
        .map_err(|e| TlsError::new(&auth.ca, format!("cannot verify clients with it: {e}")))?;
    let policy = ClientPolicy {
        required: auth.required,
        ca_digest: digest.finish().as_ref().into(),
    };
    Ok((verifier, policy))
}
