//! `weir-bench h3-cost` (issue 28): CPU per HTTP/3 request of Weir (`http3 = true` on a
//! TLS listener) and Caddy (its default `protocols h1 h2 h3`), each terminating QUIC in
//! front of the 615-byte nginx backend, with the same ECDSA P-256 certificate.
//!
//! No packaged load generator speaks HTTP/3 here (Debian's h2load is built without QUIC),
//! so the load is an HTTP/3 client written with quinn + h3 (the testkit's, the crates Weir
//! serves with) running in this process on the load CPU: `--conns` connections, each with
//! `--streams` requests in flight, for `--duration` seconds. The client is the bottleneck
//! (QUIC costs a client as much as a server), so the figure is each proxy's CPU per
//! request at the rate the client reaches, not a maximum rate. Connections are set up
//! before the CPU is read, so handshakes do not count. The two proxies alternate (A B,
//! B A, ...) and the ratio is the median of the paired ratios, as in `policy-cost`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use weir_testkit::certs::Leaf;
use weir_testkit::h3_client::{self, H3Client};

use crate::policy_cost::{median, paired};
use crate::process::{self, Child};
use crate::{peers, procfs, LOAD_CPU, PROXY_CPU};

/// Arguments of `h3-cost`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// QUIC connections.
    #[arg(long, default_value_t = 8)]
    pub conns: u32,
    /// Requests in flight on each connection.
    #[arg(long, default_value_t = 8)]
    pub streams: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Pairs of runs.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// The Weir binary (default: build target/release/weir with cargo first).
    #[arg(long)]
    pub weir: Option<PathBuf>,
}

/// A proxy being measured.
struct Proxy {
    label: &'static str,
    child: Child,
    addr: SocketAddr,
}

/// One run: requests answered 200 and the proxy's CPU seconds.
struct Run {
    requests: u64,
    cpu_s: f64,
}

pub fn main(a: Args, dir: &Path) -> Result<()> {
    let weir = match a.weir.clone() {
        Some(p) => p,
        None => crate::build_weir(&crate::repo_root())?,
    };
    let nginx = process::find_program("nginx").context("nginx is not installed")?;
    let caddy = process::find_program("caddy").context("caddy is not installed")?;
    let backend = peers::start_nginx_backend(&nginx, LOAD_CPU, dir, "h3")?;
    let ca = weir_testkit::certs::TestCa::new("weir-bench CA");
    let leaf = ca.leaf(&["localhost"]);
    let tls = ca.client_config();
    let proxies = [
        start_weir(&weir, dir, &leaf, backend.addrs[0])?,
        start_caddy(&caddy, dir, &leaf, backend.addrs[0])?,
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for p in &proxies {
        runtime.block_on(check(p, &tls))?;
        measure(&runtime, p, &tls, &a, 2)?;
    }
    let (mut weir_runs, mut caddy_runs) = (Vec::new(), Vec::new());
    for i in 0..a.repeat {
        let order = if i.is_multiple_of(2) { [0, 1] } else { [1, 0] };
        for which in order {
            let run = measure(&runtime, &proxies[which], &tls, &a, a.duration)?;
            [&mut weir_runs, &mut caddy_runs][which].push(run);
        }
    }
    print(&a, &proxies, [&weir_runs, &caddy_runs]);
    Ok(())
}

fn print(a: &Args, proxies: &[Proxy; 2], runs: [&Vec<Run>; 2]) {
    println!(
        "## h3-cost: CPU per HTTP/3 request, 615 B nginx backend, {} connections x {} streams ({} s x {} pairs)\n\n\
         | proxy | CPU us per request | req/s |\n|---|---|---|",
        a.conns, a.streams, a.duration, a.repeat
    );
    let per_req: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            r.iter()
                .map(|r| r.cpu_s / r.requests.max(1) as f64 * 1e6)
                .collect()
        })
        .collect();
    for (i, p) in proxies.iter().enumerate() {
        let rps = median(
            runs[i]
                .iter()
                .map(|r| r.requests as f64 / a.duration as f64)
                .collect(),
        );
        println!(
            "| {} | {:.2} | {rps:.0} |",
            p.label,
            median(per_req[i].clone())
        );
    }
    let (ratio, lo, hi) = paired(&per_req[0], &per_req[1]);
    println!("\nWeir / Caddy CPU per HTTP/3 request, paired: {ratio:.3} ({lo:.3}-{hi:.3})");
}

/// Weir with one TLS listener offering HTTP/3, everything to `backend`.
fn start_weir(weir: &Path, dir: &Path, leaf: &Leaf, backend: SocketAddr) -> Result<Proxy> {
    let port = process::free_port()?;
    let toml = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"bench\"\nbind = \"127.0.0.1:{port}\"\nhttp3 = true\n\
         keepalive_timeout = \"300s\"\nkeepalive_requests = 0\n\
         [listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\n\
         [[listeners.routes]]\nname = \"all\"\npath_prefix = \"/\"\nforwarded_headers = false\n\
         upstream = \"backend\"\n\
         [upstreams.backend]\nservers = [{{ addr = \"{backend}\" }}]\nmax_idle = 128\nidle_timeout = \"300s\"\n",
        leaf.cert_path.display(),
        leaf.key_path.display()
    );
    std::fs::write(dir.join("weir-h3.toml"), toml)?;
    let (addr, child) = process::spawn_weir(weir, dir, "h3", Some(PROXY_CPU), port)?;
    Ok(Proxy {
        label: "weir",
        child,
        addr,
    })
}

/// Caddy (one Go thread) with the same certificate, HTTP/3 on, everything to `backend`
/// over kept connections.
fn start_caddy(caddy: &Path, dir: &Path, leaf: &Leaf, backend: SocketAddr) -> Result<Proxy> {
    let port = process::free_port()?;
    let conf = format!(
        "{{\n\tadmin off\n\tauto_https off\n\tservers {{\n\t\tprotocols h1 h2 h3\n\t}}\n}}\n\n\
         https://localhost:{port} {{\n\tbind 127.0.0.1\n\ttls {} {}\n\
         \treverse_proxy {backend} {{\n\t\ttransport http {{\n\t\t\tkeepalive 300s\n\t\t\tkeepalive_idle_conns 128\n\t\t}}\n\t}}\n}}\n",
        leaf.cert_path.display(),
        leaf.key_path.display()
    );
    let file = dir.join("Caddyfile-h3");
    std::fs::write(&file, conf)?;
    let log = dir.join("caddy-h3.log");
    let spec = peers::caddy_spec("caddy-h3", caddy, dir, &file, PROXY_CPU, log)?;
    let mut child = process::spawn(&spec)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Proxy {
        label: "caddy",
        child,
        addr,
    })
}

/// One GET over HTTP/3 must be answered 200 with the backend's 615 bytes (the UDP side
/// may come up a moment after the TCP one: a few tries).
async fn check(p: &Proxy, tls: &rustls::ClientConfig) -> Result<()> {
    let mut last = String::new();
    for _ in 0..20 {
        match h3_client::connect(p.addr, "localhost", tls).await {
            Ok(mut client) => {
                let r = h3_client::get(&mut client.send, "localhost", "/")
                    .await
                    .map_err(anyhow::Error::msg)?;
                if r.status != 200 || r.body.len() != 615 {
                    bail!(
                        "{}: {} with {} bytes over HTTP/3",
                        p.label,
                        r.status,
                        r.body.len()
                    );
                }
                return Ok(());
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{}: no HTTP/3 connection: {last}", p.label)
}

/// Connects, then keeps `conns` x `streams` requests in flight for `secs` seconds; the
/// proxy's CPU is read around the requests only.
fn measure(
    runtime: &tokio::runtime::Runtime,
    p: &Proxy,
    tls: &rustls::ClientConfig,
    a: &Args,
    secs: u64,
) -> Result<Run> {
    let clients = runtime.block_on(connect_all(p.addr, tls, a.conns))?;
    let before = procfs::group_cpu_secs(p.child.pgid);
    let requests = runtime.block_on(run(&clients, a.streams, Duration::from_secs(secs)))?;
    let cpu_s = procfs::group_cpu_secs(p.child.pgid) - before;
    drop(clients);
    Ok(Run { requests, cpu_s })
}

async fn connect_all(
    addr: SocketAddr,
    tls: &rustls::ClientConfig,
    conns: u32,
) -> Result<Vec<Arc<H3Client>>> {
    let mut clients = Vec::new();
    for _ in 0..conns {
        let client = h3_client::connect(addr, "localhost", tls)
            .await
            .map_err(anyhow::Error::msg)?;
        clients.push(Arc::new(client));
    }
    Ok(clients)
}

/// The requests answered 200 on `clients` in `length`; any other answer or error fails.
async fn run(clients: &[Arc<H3Client>], streams: u32, length: Duration) -> Result<u64> {
    let until = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..streams {
            let client = client.clone();
            tasks.spawn(async move {
                let mut send = client.send.clone();
                let mut n = 0u64;
                while Instant::now() < until {
                    let r = h3_client::get(&mut send, "localhost", "/").await?;
                    if r.status != 200 {
                        return Err(format!("status {}", r.status));
                    }
                    n += 1;
                }
                Ok(n)
            });
        }
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done?.map_err(anyhow::Error::msg)?;
    }
    Ok(total)
}
