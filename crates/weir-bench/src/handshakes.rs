//! `weir-bench handshakes`: a new TLS connection per request, full or resumed, for the
//! `tls-handshake` scenario. No packaged tool fits: `openssl s_time` cannot send SNI (the
//! peers pick the ECDSA or the RSA certificate by name), ab cannot resume, and h2load and
//! wrk keep connections open.
//!
//! Each of `conns` tasks loops: connect, handshake (rustls, one TLS version, X25519 first
//! P-256 also listed; every peer does the same key exchange), `GET path` with `Connection: close`, read the
//! answer to its end, close. `--resume` shares one client session store, so after the
//! first connection every handshake resumes (a TLS 1.3 ticket, or TLS 1.2 ticket or session
//! ID); without it resumption is off and every handshake is full. A handshake of the other
//! kind than asked counts as an error, so a peer that stops resuming shows up. The server's
//! certificate is not verified: the figure is the proxy's CPU, and the client's own CPU
//! only has to keep up. One current-thread runtime (it runs pinned to the load CPU); one
//! JSON [`LoadOutput`] line on stdout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::ValueEnum;
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, HandshakeKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::load::LoadOutput;

/// Arguments of the hidden `handshakes` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long)]
    pub addr: SocketAddr,
    /// The server name sent (SNI): it picks the peer's certificate.
    #[arg(long, default_value = "localhost")]
    pub sni: String,
    #[arg(long, default_value = "/")]
    pub path: String,
    /// 12 or 13.
    #[arg(long, default_value_t = 13)]
    pub tls: u8,
    /// Resume sessions (else every handshake is full).
    #[arg(long)]
    pub resume: bool,
    #[arg(long, default_value_t = 8)]
    pub conns: u32,
    /// What the client offers.
    #[arg(long, value_enum, default_value_t = Profile::Browser)]
    pub profile: Profile,
    /// Seconds of load.
    #[arg(long)]
    pub duration: f64,
}

/// The SNI that picks the RSA certificate (the ECDSA one is the default, for `localhost`).
pub const RSA_NAME: &str = "rsa.localhost";

/// What the connections of one `tls-handshake` load do.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Kind {
    /// TLS 1.3, else 1.2.
    pub tls13: bool,
    /// The RSA-2048 certificate (by SNI), else the ECDSA P-256 one.
    pub rsa: bool,
    /// Resumed handshakes, else full ones.
    pub resume: bool,
    pub profile: Profile,
}

impl Kind {
    /// How a report names it: `TLS 1.3 ECDSA P-256 full, browser (...)`.
    pub fn label(&self) -> String {
        format!(
            "TLS {} {} {}, {}",
            if self.tls13 { "1.3" } else { "1.2" },
            if self.rsa { "RSA-2048" } else { "ECDSA P-256" },
            if self.resume { "resumed" } else { "full" },
            self.profile.label(),
        )
    }
}

/// The command line of one run of `conns` connections at a time.
pub fn args(addr: SocketAddr, path: &str, conns: u32, kind: &Kind, secs: u64) -> Vec<String> {
    let profile = kind
        .profile
        .to_possible_value()
        .expect("no skipped profiles");
    let mut v = vec![
        "handshakes".to_string(),
        format!("--addr={addr}"),
        format!("--path={path}"),
        format!("--sni={}", if kind.rsa { RSA_NAME } else { "localhost" }),
        format!("--tls={}", if kind.tls13 { 13 } else { 12 }),
        format!("--conns={conns}"),
        format!("--profile={}", profile.get_name()),
        format!("--duration={secs}"),
    ];
    if kind.resume {
        v.push("--resume".into());
    }
    v
}

#[derive(Default)]
struct Counts {
    done: u64,
    errors: u64,
    non2xx: u64,
}

pub fn main(a: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = runtime.block_on(run(a))?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

async fn run(a: Args) -> Result<LoadOutput> {
    let connector = TlsConnector::from(Arc::new(client_config(a.tls, a.resume, a.profile)?));
    let name = ServerName::try_from(a.sni.clone()).context("--sni")?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        a.path, a.sni
    );
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(a.duration);
    let local = tokio::task::LocalSet::new();
    let totals = local
        .run_until(async {
            let tasks: Vec<_> = (0..a.conns)
                .map(|_| {
                    tokio::task::spawn_local(client_loop(
                        a.addr,
                        connector.clone(),
                        name.clone(),
                        request.clone(),
                        a.resume,
                        until,
                    ))
                })
                .collect();
            let mut sum = Counts::default();
            for t in tasks {
                let c = t.await.unwrap_or_default();
                sum.done += c.done;
                sum.errors += c.errors;
                sum.non2xx += c.non2xx;
            }
            sum
        })
        .await;
    let secs = start.elapsed().as_secs_f64();
    Ok(LoadOutput {
        requests: totals.done,
        duration_s: secs,
        rps: totals.done as f64 / secs,
        errors: totals.errors,
        non2xx: totals.non2xx,
        ..LoadOutput::default()
    })
}

async fn client_loop(
    addr: SocketAddr,
    connector: TlsConnector,
    name: ServerName<'static>,
    request: String,
    resume: bool,
    until: Instant,
) -> Counts {
    let mut c = Counts::default();
    while Instant::now() < until {
        match one(addr, &connector, &name, request.as_bytes()).await {
            Ok((kind, status)) => {
                // The first handshake of a resuming client is necessarily full.
                let wanted = (kind == HandshakeKind::Resumed) == resume;
                if !(wanted || resume && c.done == 0) {
                    c.errors += 1;
                } else if !(200..300).contains(&status) {
                    c.non2xx += 1;
                } else {
                    c.done += 1;
                }
            }
            Err(_) => c.errors += 1,
        }
    }
    c
}

/// One connection: handshake, request, the whole answer. Returns how the handshake went
/// and the status.
async fn one(
    addr: SocketAddr,
    connector: &TlsConnector,
    name: &ServerName<'static>,
    request: &[u8],
) -> Result<(HandshakeKind, u16)> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector.connect(name.clone(), tcp).await?;
    let kind = tls.get_ref().1.handshake_kind().context("handshake kind")?;
    Ok((kind, request_to_close(&mut tls, request).await?))
}

/// Writes `request` and reads the answer until the server closes; returns its status.
pub(crate) async fn request_to_close<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    request: &[u8],
) -> Result<u16> {
    s.write_all(request).await?;
    let mut answer = Vec::with_capacity(512);
    // A peer may close without close_notify after `Connection: close`: what was read counts.
    let _ = s.read_to_end(&mut answer).await;
    answer
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .context("no status line")
}

/// What a client offers in its ClientHello: the cipher suites in its order and the key
/// exchange groups, the first of which gets a key share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// As Chrome and Firefox: AES-128-GCM first, key shares for X25519MLKEM768 and (its
    /// X25519 half, reused) X25519; P-256 and P-384 listed.
    Browser,
    /// As an OpenSSL 3.0 client (curl, wrk, ab): AES-256-GCM first, then ChaCha20 and
    /// AES-128-GCM; a key share for X25519; P-256 and P-384 listed.
    Openssl,
    /// The OpenSSL suites with P-256 alone (its key share).
    P256,
}

impl Profile {
    /// How a report names it.
    pub fn label(self) -> &'static str {
        match self {
            Profile::Browser => "browser (X25519MLKEM768 + X25519, AES-128-GCM first)",
            Profile::Openssl => "OpenSSL client (X25519, AES-256-GCM first)",
            Profile::P256 => "P-256 only (AES-256-GCM first)",
        }
    }

    fn provider(self) -> rustls::crypto::CryptoProvider {
        use rustls::crypto::aws_lc_rs::cipher_suite::*;
        use rustls::crypto::aws_lc_rs::kx_group::{SECP256R1, SECP384R1, X25519, X25519MLKEM768};
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.cipher_suites = match self {
            Profile::Browser => vec![
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
            ],
            Profile::Openssl | Profile::P256 => vec![
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
                TLS13_AES_128_GCM_SHA256,
                TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
                TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ],
        };
        // The first group gets the key share (the browser's hybrid share also carries an
        // X25519 one). OpenSSL serves an ECDSA P-256 certificate over TLS 1.2 only to
        // clients that list that curve, so every profile lists it.
        provider.kx_groups = match self {
            Profile::Browser => vec![X25519MLKEM768, X25519, SECP256R1, SECP384R1],
            Profile::Openssl => vec![X25519, SECP256R1, SECP384R1],
            Profile::P256 => vec![SECP256R1],
        };
        provider
    }
}

pub(crate) fn client_config(tls: u8, resume: bool, profile: Profile) -> Result<ClientConfig> {
    let version = match tls {
        12 => &rustls::version::TLS12,
        _ => &rustls::version::TLS13,
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(profile.provider()))
        .with_protocol_versions(&[version])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(weir_testkit::certs::AcceptAnyServerCert))
        .with_no_client_auth();
    config.resumption = if resume {
        Resumption::in_memory_sessions(1024)
    } else {
        Resumption::disabled()
    };
    Ok(config)
}
