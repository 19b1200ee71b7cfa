//! `weir-bench h3-cost` (issue 28): CPU per HTTP/3 request of Weir (`http3 = true` on a
//! TLS listener) and Caddy (its default `protocols h1 h2 h3`), each terminating QUIC in
//! front of the 615-byte nginx backend, with the same ECDSA P-256 certificate; Weir's own
//! HTTP/2 over TLS on the same listener with the same load shape; and CPU per new QUIC
//! connection (a full handshake and one request) of both.
//!
//! No packaged load generator speaks HTTP/3 here (Debian's h2load is built without QUIC),
//! so the load is driven from this process on the load CPU (`h3_load`): `--conns`
//! connections, each with `--streams` requests in flight, for `--duration` seconds. The
//! client is the bottleneck (QUIC costs a client as much as a server), so the figure is
//! each proxy's CPU per request at the rate the client reaches, not a maximum rate.
//! Kept connections are set up before the CPU is read, so their handshakes do not count.
//! The two sides of each comparison alternate (A B, B A, ...) and the ratio is the median
//! of the paired ratios, as in `policy-cost`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use weir_testkit::certs::Leaf;
use weir_testkit::h3_client;

use crate::h3_load::{self, Load};
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
        measure(&runtime, p, Load::H3, &tls, &a, 2)?;
    }
    let [weir, caddy] = &proxies;
    let comparisons = [
        (Case(weir, Load::H3), Case(caddy, Load::H3)),
        (Case(weir, Load::H3), Case(weir, Load::H2)),
        (
            Case(weir, Load::H3Handshakes),
            Case(caddy, Load::H3Handshakes),
        ),
    ];
    for (first, second) in comparisons {
        let (mut a_runs, mut b_runs) = (Vec::new(), Vec::new());
        for i in 0..a.repeat {
            let order = if i.is_multiple_of(2) { [0, 1] } else { [1, 0] };
            for which in order {
                let case = [&first, &second][which];
                let run = measure(&runtime, case.0, case.1, &tls, &a, a.duration)?;
                [&mut a_runs, &mut b_runs][which].push(run);
            }
        }
        print(&a, [&first, &second], [&a_runs, &b_runs]);
    }
    Ok(())
}

/// A proxy under one load.
struct Case<'a>(&'a Proxy, Load);

impl Case<'_> {
    fn label(&self) -> String {
        format!("{}, {}", self.0.label, self.1.label())
    }
}

/// One comparison's table and paired ratio (CPU per request; with a new connection per
/// request, that is CPU per handshake, and its inverse handshakes per CPU-second).
fn print(a: &Args, cases: [&Case; 2], runs: [&Vec<Run>; 2]) {
    let shape = match cases[0].1 {
        Load::H3Handshakes => format!("{} connections being made at once", a.conns),
        _ => format!("{} connections x {} streams", a.conns, a.streams),
    };
    println!(
        "## h3-cost: {} vs {}, 615 B nginx backend, {shape} ({} s x {} pairs)\n\n\
         | proxy, load | CPU us per request | per CPU-second | req/s |\n|---|---|---|---|",
        cases[0].label(),
        cases[1].label(),
        a.duration,
        a.repeat
    );
    let per_req: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            r.iter()
                .map(|r| r.cpu_s / r.requests.max(1) as f64 * 1e6)
                .collect()
        })
        .collect();
    for (i, case) in cases.iter().enumerate() {
        let rps = median(
            runs[i]
                .iter()
                .map(|r| r.requests as f64 / a.duration as f64)
                .collect(),
        );
        let us = median(per_req[i].clone());
        println!(
            "| {} | {us:.2} | {:.0} | {rps:.0} |",
            case.label(),
            1e6 / us
        );
    }
    let (ratio, lo, hi) = paired(&per_req[0], &per_req[1]);
    println!(
        "\n{} / {} CPU per request, paired: {ratio:.3} ({lo:.3}-{hi:.3})\n",
        cases[0].label(),
        cases[1].label()
    );
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

/// Connects (for kept connections), then runs `load` for `secs` seconds; the proxy's CPU
/// is read around the load only.
fn measure(
    runtime: &tokio::runtime::Runtime,
    p: &Proxy,
    load: Load,
    tls: &rustls::ClientConfig,
    a: &Args,
    secs: u64,
) -> Result<Run> {
    let clients = runtime.block_on(h3_load::connect(load, p.addr, tls, a.conns))?;
    let before = procfs::group_cpu_secs(p.child.pgid);
    let length = Duration::from_secs(secs);
    let requests = runtime.block_on(h3_load::run(
        &clients, p.addr, tls, a.conns, a.streams, length,
    ))?;
    let cpu_s = procfs::group_cpu_secs(p.child.pgid) - before;
    drop(clients);
    Ok(Run { requests, cpu_s })
}
