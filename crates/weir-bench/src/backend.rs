//! Backends: nginx returning 615 bytes (seeds 001 and 004) or weir-testkit servers (echo,
//! slow echo, fixed body) run in a child process of their own, `weir-bench backend`, so that
//! they can be pinned to a CPU with `taskset` and their CPU time read from `/proc` like any
//! other process. The child prints one `ADDR ip:port` line per server once it listens.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::peers;
use crate::process::{self, Child, Spec};

/// The 615-byte body of seeds 001 / 004 (the size of nginx's default index page).
pub fn body_615() -> String {
    let mut s = String::from("<!DOCTYPE html><html><body>weir-bench backend</body></html>");
    while s.len() < 615 {
        s.push('.');
    }
    s
}

/// What a scenario runs behind the proxies.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// nginx, one worker, `return 200` with 615 bytes; testkit `fixed` if nginx is missing.
    Nginx615,
    /// `count` weir-testkit echo servers (the request head comes back as the body).
    Echo { count: u32 },
    /// A weir-testkit echo server that waits `delay_ms` before answering (a CGI's think time).
    Slow { delay_ms: u64 },
    /// No backend: the proxy answers itself.
    None,
    /// A gRPC-ish h2c server: weir-testkit's `H2Backend` (the `h2` crate's server), which
    /// answers 200, echoes the request's DATA (the gRPC message) and ends with
    /// `grpc-status: 0` trailers.
    GrpcH2c,
    /// nginx, one worker, serving a static file of `bytes` bytes at every path (`tls-bulk`).
    NginxFile { bytes: u64 },
    /// No server: the files the proxies serve themselves (`static`), written under the
    /// run's `site/` ([`STATIC_FILES`]).
    Files,
}

/// The files of the `static` scenarios: name and size.
pub const STATIC_FILES: [(&str, usize); 2] = [("1k.bin", 1024), ("1m.bin", 1 << 20)];

/// Arguments of the hidden `backend` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// echo, slow or fixed.
    #[arg(long)]
    pub kind: String,
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

/// Runs the `backend` subcommand: starts the servers, announces them, then sleeps until
/// killed (the harness kills its process group).
pub fn main(a: Args) -> Result<()> {
    if a.kind == "grpc" {
        let server = weir_testkit::H2Backend::h2c();
        println!("ADDR {}", server.addr());
        use std::io::Write;
        std::io::stdout().flush()?;
        loop {
            std::thread::park();
        }
    }
    let servers: Vec<weir_testkit::Backend> = (0..a.count.max(1))
        .map(|i| match a.kind.as_str() {
            "slow" => weir_testkit::Backend::slow(Duration::from_millis(a.delay_ms)),
            "fixed" => {
                weir_testkit::Backend::fixed(200, &[("Content-Type", "text/html")], &body_615())
            }
            _ => weir_testkit::Backend::echo(&format!("echo-{}", i + 1)),
        })
        .collect();
    for s in &servers {
        println!("ADDR {}", s.addr());
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}

/// A running backend: the process group and the addresses it serves.
pub struct Running {
    pub child: Child,
    pub addrs: Vec<SocketAddr>,
    /// How it was started, for the report ("nginx 615 B", "testkit fixed 615 B (nginx missing)").
    pub about: String,
}

/// Starts `kind` on `cpu`. `None` for [`BackendKind::None`].
pub fn start(kind: BackendKind, cpu: usize, dir: &Path, tag: &str) -> Result<Option<Running>> {
    let self_exe = std::env::current_exe()?;
    let log = dir.join(format!("backend-{tag}.log"));
    let (spec, about) = match kind {
        BackendKind::None => return Ok(None),
        BackendKind::Files => {
            let site = peers::site_dir(dir);
            std::fs::create_dir_all(&site)?;
            for (name, len) in STATIC_FILES {
                let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                std::fs::write(site.join(name), body)?;
            }
            return Ok(None);
        }
        BackendKind::NginxFile { bytes } => {
            let nginx = process::find_program("nginx").context("nginx is not installed")?;
            return peers::start_nginx_file_backend(&nginx, cpu, dir, tag, bytes).map(Some);
        }
        BackendKind::Nginx615 => match process::find_program("nginx") {
            Some(nginx) => return peers::start_nginx_backend(&nginx, cpu, dir, tag).map(Some),
            None => (
                Spec::new("backend", self_exe, Some(cpu), log).args(["backend", "--kind=fixed"]),
                "weir-testkit fixed 615 B (nginx not installed)".to_string(),
            ),
        },
        BackendKind::Echo { count } => (
            Spec::new("backend", self_exe, Some(cpu), log).args([
                "backend".to_string(),
                "--kind=echo".into(),
                format!("--count={count}"),
            ]),
            format!("{count} weir-testkit echo server(s)"),
        ),
        BackendKind::GrpcH2c => (
            Spec::new("backend", self_exe, Some(cpu), log).args(["backend", "--kind=grpc"]),
            "weir-testkit H2Backend (h2 crate server, h2c): echoes the gRPC message, \
             grpc-status 0 trailers"
                .to_string(),
        ),
        BackendKind::Slow { delay_ms } => (
            Spec::new("backend", self_exe, Some(cpu), log).args([
                "backend".to_string(),
                "--kind=slow".into(),
                format!("--delay-ms={delay_ms}"),
            ]),
            format!("weir-testkit echo with {delay_ms} ms think time"),
        ),
    };
    let count = match kind {
        BackendKind::Echo { count } => count.max(1) as usize,
        _ => 1,
    };
    let mut child = process::spawn(&spec.piped())?;
    let addrs = child
        .stdout_lines(count)?
        .iter()
        .map(|l| {
            l.strip_prefix("ADDR ")
                .unwrap_or(l)
                .parse()
                .with_context(|| format!("backend announced {l:?}"))
        })
        .collect::<Result<Vec<SocketAddr>>>()?;
    Ok(Some(Running {
        child,
        addrs,
        about,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn body_is_615_bytes() {
        let b = super::body_615();
        assert_eq!(b.len(), 615);
        assert!(
            !b.contains(['"', '$', '\n']),
            "must be safe inside an nginx string"
        );
    }
}
