//! TLS test backends and clients: the HTTP behaviours of [`Backend`] served over TLS
//! (rustls), optionally requiring a client certificate, recording the SNI each handshake
//! carried and whether it resumed a session; and [`Client::connect_tls`], the keep-alive client over TLS.
//!
//! ```no_run
//! use weir_testkit::{certs::TestCa, Backend, TlsServer};
//! let ca = TestCa::new("upstream CA");
//! let backend = Backend::echo_tls("a", &TlsServer::new(&ca.leaf(&["a.example.com"])));
//! // ... proxy to backend.addr(); backend.sni_seen() lists the names clients asked for.
//! ```

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use crate::backend::{Backend, Stats};
use crate::behaviours::Behaviour;
use crate::certs::Leaf;
use crate::client::Client;
use crate::wire::{Conn, Stream};

/// How long a backend waits for a client's handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The TLS side of a test backend: its certificate and, optionally, the CA its clients'
/// certificates must chain to.
#[derive(Clone)]
pub struct TlsServer {
    config: Arc<ServerConfig>,
}

impl TlsServer {
    /// Presents `leaf` (its chain file and key); no client certificate asked for.
    pub fn new(leaf: &Leaf) -> TlsServer {
        TlsServer::build(leaf, None)
    }

    /// Presents `leaf` and requires a client certificate signed by the CA in `client_ca`.
    pub fn requiring_client_cert(leaf: &Leaf, client_ca: &Path) -> TlsServer {
        TlsServer::build(leaf, Some(client_ca))
    }

    /// Presents `leaf` and offers only ALPN `h2` (for [`crate::H2Backend`]).
    pub fn h2(leaf: &Leaf) -> TlsServer {
        let mut config = (*TlsServer::new(leaf).config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        TlsServer {
            config: Arc::new(config),
        }
    }

    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }

    fn build(leaf: &Leaf, client_ca: Option<&Path>) -> TlsServer {
        let chain = certs(&leaf.cert_path);
        let key = PrivateKeyDer::from_pem_file(&leaf.key_path).expect("testkit: read a key");
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("testkit: protocol versions");
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)), provider())
                        .build()
                        .expect("testkit: client verifier");
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .expect("testkit: certificate and key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TlsServer {
            config: Arc::new(config),
        }
    }
}

/// Every certificate in the PEM file at `path`.
fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .expect("testkit: open a certificate file")
        .collect::<Result<_, _>>()
        .expect("testkit: read certificates")
}

/// A root store of the certificates in the PEM file at `path`.
fn roots(path: &Path) -> RootCertStore {
    let mut store = RootCertStore::empty();
    for cert in certs(path) {
        store.add(cert).expect("testkit: add a root");
    }
    store
}

impl Backend {
    /// [`Backend::echo`] over TLS (HTTPS): 200 with `X-Backend: <name>` and the request
    /// echoed. [`Backend::sni_seen`] and [`Backend::tls_failures`] report the handshakes.
    pub fn echo_tls(name: &str, tls: &TlsServer) -> Backend {
        let behaviour = Behaviour::Echo {
            name: name.to_string(),
            delay: Duration::ZERO,
            close_each: false,
            close_after: None,
        };
        Backend::spawn_with(behaviour, Some(TlsAcceptor::from(tls.config.clone())))
    }
}

/// Completes the server side of a handshake, recording its SNI (or the failure).
pub(crate) async fn accept(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    stats: &Stats,
) -> Option<Conn> {
    let _ = stream.set_nodelay(true);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
    match handshake {
        Ok(Ok(tls)) => {
            let state = tls.get_ref().1;
            let name = state.server_name().unwrap_or_default().to_string();
            if state.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                stats.tls_resumed.fetch_add(1, Ordering::SeqCst);
            }
            if let Ok(mut seen) = stats.sni.lock() {
                seen.push(name);
            }
            Some(Conn::over(Stream::Tls(Box::new(TlsStream::Server(tls)))))
        }
        _ => {
            stats.tls_failures.fetch_add(1, Ordering::SeqCst);
            None
        }
    }
}

impl Client {
    /// Connects to `addr` over TLS, asking for `server_name` (SNI; an IP address sends
    /// none) and trusting only the CA certificate(s) in the PEM file `ca`.
    pub async fn connect_tls(addr: SocketAddr, server_name: &str, ca: &Path) -> io::Result<Client> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots(ca))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(server_name.to_string()).map_err(io::Error::other)?;
        let tcp = TcpStream::connect(addr).await?;
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(Arc::new(config));
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(name, tcp))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        Ok(Client::over(Conn::over(Stream::Tls(Box::new(
            TlsStream::Client(stream),
        )))))
    }
}
