//! Test certificates: a throw-away CA and leaf certificates it signs, written as PEM files
//! into a directory of their own, for TLS tests of listeners, upstreams and clients.
//!
//! ```no_run
//! let ca = weir_testkit::certs::TestCa::new("Weir test CA");
//! let leaf = ca.leaf(&["a.example.com", "*.b.example.com"]);
//! // leaf.cert_path: chain (leaf then CA) PEM; leaf.key_path: PKCS#8 key PEM;
//! // ca.cert_path: the CA certificate, to trust in a client or as a client-auth CA.
//! ```
//!
//! Every call makes a fresh key pair (ECDSA P-256): tests do not share secrets across runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// A directory removed when dropped, holding the PEM files of one test.
pub struct CertDir {
    path: PathBuf,
}

impl CertDir {
    /// A fresh, empty directory under the system temp dir.
    pub fn new() -> CertDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("weir-certs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create the test certificate directory");
        CertDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` in this directory and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, contents).expect("write a test certificate file");
        path
    }
}

impl Default for CertDir {
    fn default() -> Self {
        CertDir::new()
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A certificate authority that signs leaf certificates for tests.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// `ca.pem` in `dir`.
    pub cert_path: PathBuf,
    /// Where this CA and its leaves write their files.
    pub dir: CertDir,
    leaves: AtomicU64,
}

/// A leaf certificate and its key, as PEM text and as files.
pub struct Leaf {
    /// The leaf certificate alone, PEM.
    pub cert_pem: String,
    /// Leaf then CA certificate, PEM (what a server presents).
    pub chain_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
    /// File holding `chain_pem`.
    pub cert_path: PathBuf,
    /// File holding `key_pem`.
    pub key_path: PathBuf,
}

/// How a leaf certificate is made; `Default` is a server certificate valid now for a year.
#[derive(Clone, Debug)]
pub struct LeafOptions {
    /// Subject common name (defaults to the first name).
    pub common_name: Option<String>,
    /// Days from now: the certificate is valid from `not_before_days` to `not_after_days`
    /// (negative values lie in the past, so an expired certificate is `-10 .. -1`).
    pub not_before_days: i64,
    pub not_after_days: i64,
    /// A client certificate (extended key usage clientAuth) instead of a server one.
    pub client: bool,
}

impl Default for LeafOptions {
    fn default() -> Self {
        LeafOptions {
            common_name: None,
            not_before_days: -1,
            not_after_days: 365,
            client: false,
        }
    }
}

impl TestCa {
    /// A new self-signed CA named `name`, written to `ca.pem` in a fresh directory.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name = named(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        let cert_pem = cert.pem();
        let dir = CertDir::new();
        let cert_path = dir.write("ca.pem", &cert_pem);
        TestCa {
            issuer: Issuer::new(params, key),
            cert_pem,
            cert_path,
            dir,
            leaves: AtomicU64::new(0),
        }
    }

    /// A rustls client config trusting this CA (default versions, no ALPN, no client
    /// certificate).
    pub fn client_config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(self.roots())
            .with_no_client_auth();
        std::sync::Arc::new(config)
    }

    /// A root store trusting this CA only.
    pub fn roots(&self) -> rustls::RootCertStore {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(self.cert_pem.as_bytes());
        roots
            .add(ca.expect("the CA's PEM"))
            .expect("the CA certificate");
        roots
    }

    /// A server certificate for `names` (DNS names, wildcards allowed, or IP addresses),
    /// valid now for a year.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, &LeafOptions::default())
    }

    /// A client certificate (clientAuth) with common name `name`.
    pub fn client(&self, name: &str) -> Leaf {
        let options = LeafOptions {
            common_name: Some(name.to_string()),
            client: true,
            ..LeafOptions::default()
        };
        self.leaf_with(&[name], &options)
    }

    /// A server certificate for `names` with an RSA-2048 key (the others are ECDSA P-256).
    pub fn leaf_rsa(&self, names: &[&str]) -> Leaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("generate an RSA key");
        self.leaf_with_key(names, &LeafOptions::default(), key)
    }

    /// A leaf certificate made as `options` say.
    pub fn leaf_with(&self, names: &[&str], options: &LeafOptions) -> Leaf {
        let key = KeyPair::generate().expect("generate a leaf key");
        self.leaf_with_key(names, options, key)
    }

    fn leaf_with_key(&self, names: &[&str], options: &LeafOptions, key: KeyPair) -> Leaf {
        let owned: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(owned).expect("leaf names");
        let cn = options
            .common_name
            .clone()
            .or_else(|| names.first().map(|n| n.to_string()))
            .unwrap_or_else(|| "weir test leaf".to_string());
        params.distinguished_name = named(&cn);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(options.not_before_days);
        params.not_after = now + time::Duration::days(options.not_after_days);
        params.extended_key_usages = vec![if options.client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign a leaf certificate");
        let cert_pem = cert.pem();
        let chain_pem = format!("{cert_pem}{}", self.cert_pem);
        let key_pem = key.serialize_pem();
        let n = self.leaves.fetch_add(1, Ordering::Relaxed);
        let stem = names
            .first()
            .copied()
            .unwrap_or("leaf")
            .replace('*', "star");
        let cert_path = self.dir.write(&format!("{stem}-{n}.pem"), &chain_pem);
        let key_path = self.dir.write(&format!("{stem}-{n}.key"), &key_pem);
        Leaf {
            cert_pem,
            chain_pem,
            key_pem,
            cert_path,
            key_path,
        }
    }
}

fn named(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_and_a_chain_with_its_key() {
        let ca = TestCa::new("test CA");
        let leaf = ca.leaf(&["a.example.com", "*.b.example.com"]);
        let chain = std::fs::read_to_string(&leaf.cert_path).unwrap();
        assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(chain.starts_with(&leaf.cert_pem));
        assert!(std::fs::read_to_string(&leaf.key_path)
            .unwrap()
            .contains("PRIVATE KEY"));
        assert!(std::fs::read_to_string(&ca.cert_path)
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        let dir = ca.dir.path().to_path_buf();
        drop(leaf);
        drop(ca);
        assert!(!dir.exists(), "the directory goes with the CA");
    }

    #[test]
    fn leaves_get_distinct_files() {
        let ca = TestCa::new("test CA");
        let a = ca.leaf(&["x.test"]);
        let b = ca.leaf(&["x.test"]);
        assert_ne!(a.cert_path, b.cert_path);
        assert_ne!(a.key_pem, b.key_pem);
    }
}

/// A client-side verifier that accepts any server certificate and any handshake signature:
/// for clients that check what was presented themselves (the ACME tests, whose pebble root
/// changes every run) or measure only the server's CPU (`weir-bench handshakes`).
#[derive(Debug)]
pub struct AcceptAnyServerCert;

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
