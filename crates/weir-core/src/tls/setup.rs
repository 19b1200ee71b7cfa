//! A listener's TLS setup: its certificates and the rustls `ServerConfig` every worker's
//! handshakes use. Built once per config generation (in the snapshot, behind an `Arc`), so
//! the ticket keys and the session cache are the same on every worker and a session
//! resumes wherever the kernel hands the client's next connection.

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
    /// The client-certificate header name as configured, and lower-cased (for removing
    /// client-sent copies).
    pub client_cert_header: Option<(Box<str>, Box<[u8]>)>,
}

impl ListenerTls {
    /// Reads the listener's certificate, key and CA files and builds its rustls config.
    /// With `previous` (the same listener before a reload) the ticket keys and session
    /// cache carry over, so clients keep resuming across reloads.
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
        let mut server_config = server_config(tls, provider, store.clone())?;
        if let Some(before) = previous.filter(|_| tls.session_resumption) {
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
        let client_cert_header = tls.client_cert_header.as_deref().map(|name| {
            let lower = name.to_ascii_lowercase().into_bytes().into_boxed_slice();
            (Box::from(name), lower)
        });
        Ok(ListenerTls {
            server_config: Arc::new(server_config),
            challenge_config,
            store,
            handshake_timeout: tls.handshake_timeout,
            max_handshakes: tls.max_handshakes,
            client_cert_header,
        })
    }
}

fn server_config(
    tls: &Tls,
    provider: Arc<CryptoProvider>,
    store: Arc<CertStore>,
) -> Result<ServerConfig, TlsError> {
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
    let builder = match &tls.client_auth {
        None => builder.with_no_client_auth(),
        Some(auth) => builder.with_client_cert_verifier(client_verifier(auth, provider)?),
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
    Ok(config)
}

/// Verifies client certificates against the CAs in `auth.ca`.
fn client_verifier(
    auth: &ClientAuth,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_chain(&auth.ca)? {
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
    builder
        .build()
        .map_err(|e| TlsError::new(&auth.ca, format!("cannot verify clients with it: {e}")))
}
