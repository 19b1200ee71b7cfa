//! The proxies under test and how each is configured and started. The fairness settings (one
//! worker, upstream keep-alive, logging off, no keep-alive request cap) live in the templates
//! under `bench/templates/`; `configs.rs` fills in ports, paths, backends and routes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::backend::{body_615, Running};
use crate::configs::{apache_conf, caddyfile, haproxy_cfg, nginx_conf, nginx_proxy, weir_toml};
use crate::process::{self, Child, Spec};

/// The prefix of the `cgi-prefix` scenario (Apache `ProxyPass /cgi/ http://backend/`).
pub const CGI_PREFIX: &str = "/cgi/";
/// The body every peer's default backend answers with (status 404).
pub const NO_ROUTE: &str = "no route";

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    /// No proxy: the load goes straight to a backend pinned to the proxy CPU.
    Direct,
    Weir,
    /// Weir with a JSON access log to a file and the admin listener on (the cost of
    /// observability, against `Weir` with both off).
    WeirObserved,
    WeirTcp,
    Nginx,
    HaproxyHttp,
    HaproxyTcp,
    Caddy,
    Apache,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Direct => "direct",
            Peer::Weir => "weir",
            Peer::WeirObserved => "weir-observed",
            Peer::WeirTcp => "weir-tcp",
            Peer::Nginx => "nginx",
            Peer::HaproxyHttp => "haproxy-http",
            Peer::HaproxyTcp => "haproxy-tcp",
            Peer::Caddy => "caddy",
            Peer::Apache => "apache-event",
        }
    }

    pub fn is_weir(self) -> bool {
        matches!(self, Peer::Weir | Peer::WeirObserved | Peer::WeirTcp)
    }
}

/// What the proxy does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// Everything to the backend pool (round robin when there are several).
    Proxy,
    /// `/cgi/x` to the backend as `/x`; anything else is the default 404.
    Prefix,
    /// No route: the proxy's own 404 "no route".
    Default,
    /// Everything answered by the proxy itself: 200 "ok" (Weir `respond`, nginx `return
    /// 200`, HAProxy `http-request return`).
    Respond,
    /// Everything to the HTTP/1.1 backend, clients speak h2c with prior knowledge (nginx
    /// `listen ... http2` without TLS, HAProxy `bind ... proto h2`; Weir detects it).
    H2c,
    /// h2c clients' gRPC calls to an h2c gRPC backend (nginx `grpc_pass`, HAProxy
    /// `server ... proto h2`, Weir `protocol = "h2c"`).
    Grpc,
    /// Files from the run's `site/` directory (`BackendKind::Files`): nginx `root` with
    /// `sendfile on`, Caddy `file_server`, Weir `files`.
    Static,
}

impl Route {
    /// The clients speak h2c with prior knowledge (HTTP/1.1 checks cannot reach the peer).
    pub fn h2c_front(self) -> bool {
        matches!(self, Route::H2c | Route::Grpc)
    }
}

/// The directory the `static` scenarios serve, under the run's directory.
pub fn site_dir(dir: &Path) -> PathBuf {
    dir.join("site")
}

/// Inputs shared by every peer's configuration.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub backends: &'a [SocketAddr],
    pub route: Route,
    /// The most requests any load of the scenario has in flight (connections, times streams
    /// for HTTP/2): sizes pools and thread counts.
    pub max_conns: u32,
    pub weir: &'a Path,
    /// Give Weir an admin listener (for `/metrics`).
    pub admin: bool,
    /// Terminate TLS with this certificate (`tls-proxy`): every peer uses the same one.
    pub tls: Option<&'a TlsFiles>,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signed `cert`: what the check request trusts.
    pub ca: PathBuf,
    /// An RSA-2048 certificate and key served for the name `handshakes::RSA_NAME`
    /// (`tls-handshake`), next to the default ECDSA one.
    pub rsa: Option<(PathBuf, PathBuf)>,
}

/// The PEM file HAProxy loads for a certificate: its chain then its key (written by the
/// harness next to the certificate).
pub fn haproxy_pem(cert: &Path) -> PathBuf {
    cert.with_extension("haproxy.pem")
}

/// A started peer.
pub struct Started {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
}

fn apache_binary() -> Option<PathBuf> {
    process::find_program("apache2").or_else(|| process::find_program("httpd"))
}

fn apache_modules() -> Option<PathBuf> {
    [
        "/usr/lib/apache2/modules",
        "/usr/lib64/httpd/modules",
        "/usr/lib/httpd/modules",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|d| {
        ["mod_mpm_event.so", "mod_proxy_http.so", "mod_authz_core.so"]
            .iter()
            .all(|m| d.join(m).exists())
    })
}

/// The program that runs `peer`, or why it is not available.
pub fn program(peer: Peer, weir: &Path) -> std::result::Result<PathBuf, String> {
    let found = match peer {
        Peer::Direct => return Ok(PathBuf::new()),
        Peer::Weir | Peer::WeirObserved | Peer::WeirTcp => {
            Some(weir.to_path_buf()).filter(|p| p.exists())
        }
        Peer::Nginx => process::find_program("nginx"),
        Peer::HaproxyHttp | Peer::HaproxyTcp => process::find_program("haproxy"),
        Peer::Caddy => process::find_program("caddy"),
        Peer::Apache => apache_binary().filter(|_| apache_modules().is_some()),
    };
    found.ok_or_else(|| format!("{} is not installed (run bench/setup.sh)", peer.name()))
}

pub(crate) fn start_nginx(
    nginx: &Path,
    name: &str,
    cpu: usize,
    dir: &Path,
    conf: &str,
) -> Result<Child> {
    let path = dir.join(format!("{name}.conf"));
    std::fs::write(&path, conf)?;
    let err = dir.join(format!("{name}.error.log"));
    let spec = Spec::new(name, nginx, Some(cpu), dir.join(format!("{name}.log"))).args([
        "-p".to_string(),
        dir.to_string_lossy().into_owned(),
        "-e".into(),
        err.to_string_lossy().into_owned(),
        "-c".into(),
        path.to_string_lossy().into_owned(),
    ]);
    process::spawn(&spec)
}

/// nginx as the 615-byte backend of seeds 001 / 004.
pub fn start_nginx_backend(nginx: &Path, cpu: usize, dir: &Path, tag: &str) -> Result<Running> {
    let port = process::free_port()?;
    let name = format!("backend-nginx-{tag}");
    let locations = format!(
        "        location / {{\n            return 200 \"{}\";\n        }}",
        body_615()
    );
    let conf = nginx_conf(&name, dir, port, "", &locations, None)?;
    let mut child = start_nginx(nginx, &name, cpu, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Running {
        child,
        addrs: vec![addr],
        about: "nginx, 1 worker, return 200 with 615 B".into(),
    })
}

/// nginx serving one file of `bytes` bytes for every path (the `tls-bulk` backend).
pub fn start_nginx_file_backend(
    nginx: &Path,
    cpu: usize,
    dir: &Path,
    tag: &str,
    bytes: u64,
) -> Result<Running> {
    let port = process::free_port()?;
    let name = format!("backend-file-{tag}");
    let root = dir.join(&name);
    std::fs::create_dir_all(&root)?;
    let mut body = vec![b'x'; bytes as usize];
    body.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = b'a' + (i % 26) as u8);
    std::fs::write(root.join("file.bin"), body)?;
    let locations = format!(
        "        location / {{\n            root {};\n            try_files /file.bin =404;\n        }}",
        root.display()
    );
    let conf = nginx_conf(&name, dir, port, "", &locations, None)?;
    let mut child = start_nginx(nginx, &name, cpu, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Running {
        child,
        addrs: vec![addr],
        about: format!("nginx, 1 worker, a static file of {bytes} B"),
    })
}

/// Caddy run with the Caddyfile `conf` pinned to `cpu`, with one Go thread and its state
/// in a directory of its own under `dir`.
pub(crate) fn caddy_spec(
    name: &str,
    caddy: &Path,
    dir: &Path,
    conf: &Path,
    cpu: usize,
    log: PathBuf,
) -> Result<Spec> {
    let home = dir.join(format!("{name}-home"));
    std::fs::create_dir_all(&home)?;
    let h = home.to_string_lossy();
    Ok(Spec::new(name, caddy, Some(cpu), log)
        .args([
            "run".to_string(),
            "--config".into(),
            conf.to_string_lossy().into_owned(),
            "--adapter".into(),
            "caddyfile".into(),
        ])
        .env("GOMAXPROCS", "1")
        .env("HOME", &h)
        .env("XDG_DATA_HOME", &format!("{h}/data"))
        .env("XDG_CONFIG_HOME", &format!("{h}/config")))
}

/// Writes `peer`'s configuration and starts it pinned to `cpu`; returns once it listens.
pub fn start(peer: Peer, s: &Setup, cpu: usize) -> Result<Started> {
    let program = program(peer, s.weir).map_err(anyhow::Error::msg)?;
    let port = process::free_port()?;
    let name = peer.name();
    let file = |ext: &str| s.dir.join(format!("{name}.{ext}"));
    let log = file("log");
    let mut admin = None;
    let spec = match peer {
        Peer::Direct => bail!("direct is not a proxy"),
        Peer::Weir | Peer::WeirObserved | Peer::WeirTcp => {
            let observed = peer == Peer::WeirObserved;
            let admin_port = if s.admin || observed {
                Some(process::free_port()?)
            } else {
                None
            };
            admin = admin_port.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
            let conf = file("toml");
            std::fs::write(
                &conf,
                weir_toml(
                    s,
                    port,
                    admin_port,
                    peer == Peer::WeirTcp,
                    observed.then(|| file("access.log")).as_deref(),
                )?,
            )?;
            let check = Command::new(&program)
                .arg("check")
                .arg("-c")
                .arg(&conf)
                .output()?;
            if !check.status.success() {
                let why = String::from_utf8_lossy(&check.stderr);
                let why: String = why.trim().chars().take(160).collect();
                bail!("weir check: {why}");
            }
            Spec::new(name, program, Some(cpu), log)
                .args([
                    "run".to_string(),
                    "-c".into(),
                    conf.to_string_lossy().into_owned(),
                ])
                .env("WEIR_LOG", "warn")
        }
        Peer::Nginx => {
            return started(
                start_nginx(&program, name, cpu, s.dir, &nginx_proxy(s, port)?)?,
                port,
                None,
            )
        }
        Peer::HaproxyHttp | Peer::HaproxyTcp => {
            let conf = file("cfg");
            std::fs::write(&conf, haproxy_cfg(s, port, peer == Peer::HaproxyTcp)?)?;
            Spec::new(name, program, Some(cpu), log).args([
                "-db".to_string(),
                "-f".into(),
                conf.to_string_lossy().into_owned(),
            ])
        }
        Peer::Caddy => {
            let conf = file("Caddyfile");
            std::fs::write(&conf, caddyfile(s, port)?)?;
            caddy_spec(name, &program, s.dir, &conf, cpu, log)?
        }
        Peer::Apache => {
            let moddir = apache_modules().context("apache modules")?;
            std::fs::create_dir_all(s.dir.join("apache-htdocs"))?;
            let conf = file("conf");
            std::fs::write(&conf, apache_conf(s, port, &moddir)?)?;
            Spec::new(name, program, Some(cpu), log).args([
                "-f".to_string(),
                conf.to_string_lossy().into_owned(),
                "-DFOREGROUND".into(),
            ])
        }
    };
    started(process::spawn(&spec)?, port, admin)
}

fn started(mut child: Child, port: u16, admin: Option<SocketAddr>) -> Result<Started> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Started { child, addr, admin })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_weir_is_reported() {
        assert!(program(Peer::Weir, Path::new("/nonexistent/weir")).is_err());
        assert!(program(Peer::Direct, Path::new("/x")).is_ok());
    }
}
