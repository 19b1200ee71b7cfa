//! Issue 16's two cost figures, each a subcommand of its own:
//!
//! - `weir-bench compression-cpu`: CPU per MiB of gzip output, Weir `compression` at level
//!   L vs nginx `gzip on; gzip_comp_level L`, both in front of the same nginx backend
//!   serving the same ~100 KiB JSON file, wrk sending `Accept-Encoding: gzip`.
//! - `weir-bench policy-cost`: Weir's CPU per request on a plain route vs a route with a
//!   redirect-free policy (request_headers, response_headers, rate_limit, allow), in front
//!   of the 615-byte nginx backend (target: under 3 % more).
//! - `weir-bench tracing-cost` (issue 31): Weir's CPU per request without `[tracing]`
//!   against 1 % sampling and against every request sampled, the spans exported to a
//!   collector that accepts them (the backend nginx's `return 200` answers the OTLP posts).
//!
//! The proxy is pinned to CPU 0; backend, wrk and harness to CPU 1. The two runs compared
//! alternate (A B, B A, ...) so each pair is seconds apart; the ratio quoted is the median
//! of the paired ratios (docs/benchmarks.md, "Ratios").

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::process::{self, Child, Spec};
use crate::{configs, peers, procfs, wrk, LOAD_CPU, PROXY_CPU};

/// Arguments of `compression-cpu` and `policy-cost`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// gzip level for both proxies (compression-cpu).
    #[arg(long, default_value_t = 1)]
    pub level: u32,
    /// wrk connections.
    #[arg(long, default_value_t = 32)]
    pub conns: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Pairs of runs.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// The Weir binary (default: build target/release/weir with cargo first).
    #[arg(long)]
    pub weir: Option<PathBuf>,
    /// policy-cost: also compare the plain route with this Weir binary's (an older commit):
    /// what the new code costs a route that does not use it.
    #[arg(long)]
    pub weir_base: Option<PathBuf>,
    /// policy-cost, tracing-cost: h2c clients (h2load, prior knowledge, 4 streams per
    /// connection) instead of wrk's HTTP/1.1.
    #[arg(long)]
    pub h2c: bool,
}

/// A proxy being measured.
pub(crate) struct Proxy {
    pub label: String,
    pub child: Child,
    pub addr: SocketAddr,
}

/// One wrk run through a proxy: requests, response bytes, the proxy's CPU seconds.
#[derive(Clone, Copy, Default)]
pub(crate) struct Run {
    requests: u64,
    bytes: u64,
    cpu_s: f64,
    /// The load generator's 99th percentile latency, when it reports one.
    p99_us: Option<f64>,
}

/// The JSON body (about 100 KiB of varied records, as an API would return).
fn json_body() -> String {
    let mut s = String::from("[");
    let mut i = 0u64;
    while s.len() < 100 * 1024 {
        let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        s.push_str(&format!(
            "{{\"id\":{i},\"user\":\"user{:x}\",\"score\":{},\"active\":{},\"tags\":[\"t{}\",\"t{}\"],\"note\":\"record {i} of the benchmark body\"}},\n",
            h >> 40,
            h % 10_000,
            h.is_multiple_of(3),
            h % 17,
            h % 29
        ));
        i += 1;
    }
    s.push_str("{}]\n");
    s
}

/// nginx serving `body.json` from `dir` (no compression) on CPU 1.
fn json_backend(nginx: &Path, dir: &Path) -> Result<(Child, SocketAddr)> {
    std::fs::write(dir.join("body.json"), json_body())?;
    let port = process::free_port()?;
    let locations = format!(
        "        location / {{\n            root {};\n            default_type application/json;\n            gzip off;\n        }}\n",
        dir.display()
    );
    let conf = configs::nginx_conf("json-backend", dir, port, "", &locations, None)?;
    let mut child = peers::start_nginx(nginx, "json-backend", LOAD_CPU, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok((child, addr))
}

/// Weir with one route on `/` to `backend` carrying `keys`, and the top-level `tables`.
pub(crate) fn start_weir(
    weir: &Path,
    dir: &Path,
    tag: &str,
    backend: SocketAddr,
    keys: &str,
    tables: &str,
) -> Result<Proxy> {
    let port = process::free_port()?;
    let toml = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"bench\"\nbind = \"127.0.0.1:{port}\"\nbacklog = 4096\n\
         keepalive_timeout = \"300s\"\nkeepalive_requests = 0\n\
         [[listeners.routes]]\nname = \"all\"\npath_prefix = \"/\"\nforwarded_headers = false\n\
         upstream = \"backend\"\n{keys}\n\
         [upstreams.backend]\nservers = [{{ addr = \"{backend}\" }}]\nmax_idle = 128\nidle_timeout = \"300s\"\n{tables}"
    );
    let path = dir.join(format!("weir-{tag}.toml"));
    std::fs::write(&path, toml)?;
    let check = std::process::Command::new(weir)
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()?;
    if !check.status.success() {
        bail!(
            "weir check {}: {}",
            path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let (addr, child) = process::spawn_weir(weir, dir, tag, Some(PROXY_CPU), port)?;
    Ok(Proxy {
        label: format!("weir {tag}"),
        child,
        addr,
    })
}

/// nginx proxying to `backend` with `gzip on` at `level`.
fn start_nginx_gzip(nginx: &Path, dir: &Path, backend: SocketAddr, level: u32) -> Result<Proxy> {
    let port = process::free_port()?;
    let upstream = format!(
        "    upstream backend {{\n        server {backend};\n        keepalive 128;\n        keepalive_requests 1000000;\n        keepalive_timeout 300s;\n    }}\n"
    );
    let locations = format!(
        "        location / {{\n            gzip on;\n            gzip_comp_level {level};\n            gzip_types application/json;\n            gzip_min_length 1024;\n            gzip_proxied any;\n            gzip_vary on;\n            proxy_pass http://backend;\n        }}\n"
    );
    let conf = configs::nginx_conf("nginx-gzip", dir, port, &upstream, &locations, None)?;
    let mut child = peers::start_nginx(nginx, "nginx-gzip", PROXY_CPU, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Proxy {
        label: format!("nginx gzip_comp_level {level}"),
        child,
        addr,
    })
}

/// `GET path` with `accept` as Accept-Encoding: the response head, lower-cased.
pub(crate) fn probe_head(addr: SocketAddr, path: &str, accept: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: {accept}\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase())
}

/// wrk against `p` for `secs` with `headers`; the proxy's CPU from /proc.
fn measure(
    p: &Proxy,
    dir: &Path,
    secs: u64,
    conns: u32,
    h2c: bool,
    headers: &[&str],
    path: &str,
) -> Result<Run> {
    if h2c {
        return measure_h2c(p, dir, secs, conns, path);
    }
    let wrk = process::find_program("wrk").context("wrk is not installed (bench/setup.sh)")?;
    let script = dir.join("report.lua");
    std::fs::write(&script, wrk::REPORT_LUA)?;
    let url = format!("http://{}{path}", p.addr);
    let mut args = wrk::args(conns, secs, &script.to_string_lossy(), &url);
    for h in headers {
        args.insert(0, (*h).to_string());
        args.insert(0, "-H".into());
    }
    let spec = Spec::new("wrk", wrk, Some(LOAD_CPU), dir.join("wrk.log"))
        .args(args)
        .piped();
    let before = procfs::group_cpu_secs(p.child.pgid);
    let done = process::spawn(&spec)?.finish()?;
    let cpu_s = procfs::group_cpu_secs(p.child.pgid) - before;
    let out = wrk::parse(&done.stdout)?;
    if out.errors > 0 || out.non2xx > 0 {
        bail!("{}: {} errors, {} non-2xx", p.label, out.errors, out.non2xx);
    }
    let bytes = done
        .stdout
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("bytes="))
        })
        .and_then(|v| v.parse().ok())
        .context("no byte count in wrk output")?;
    Ok(Run {
        requests: out.requests,
        bytes,
        cpu_s,
        p99_us: out.p99_us,
    })
}

/// h2load (h2c with prior knowledge) against `p` for `secs`; the proxy's CPU from /proc.
fn measure_h2c(p: &Proxy, dir: &Path, secs: u64, conns: u32, path: &str) -> Result<Run> {
    let h2load =
        process::find_program("h2load").context("h2load is not installed (bench/setup.sh)")?;
    let url = format!("http://{}{path}", p.addr);
    let spec = Spec::new("h2load", h2load, Some(LOAD_CPU), dir.join("h2load.log"))
        .args(crate::h2load::args(conns, 4, secs, &url))
        .piped();
    let before = procfs::group_cpu_secs(p.child.pgid);
    let done = process::spawn(&spec)?.finish()?;
    let cpu_s = procfs::group_cpu_secs(p.child.pgid) - before;
    let out = crate::h2load::parse(&done.stdout)?;
    if out.errors > 0 || out.non2xx > 0 {
        bail!("{}: {} errors, {} non-2xx", p.label, out.errors, out.non2xx);
    }
    Ok(Run {
        requests: out.requests,
        bytes: 0,
        cpu_s,
        p99_us: out.p99_us,
    })
}

/// Runs `a` and `b` alternately `repeat` times (after one warm-up each) with `figure`
/// computed per run; returns the runs of each.
pub(crate) fn alternate(
    a: &Proxy,
    b: &Proxy,
    args: &Args,
    dir: &Path,
    headers: &[&str],
    path: &str,
) -> Result<(Vec<Run>, Vec<Run>)> {
    for p in [a, b] {
        measure(p, dir, 2, args.conns, args.h2c, headers, path)?;
    }
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for i in 0..args.repeat {
        let order = if i.is_multiple_of(2) { [a, b] } else { [b, a] };
        for p in order {
            let run = measure(p, dir, args.duration, args.conns, args.h2c, headers, path)?;
            if std::ptr::eq(p, a) {
                ra.push(run)
            } else {
                rb.push(run)
            }
        }
    }
    Ok((ra, rb))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if !n.is_multiple_of(2) => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Median, min and max of `a[i] / b[i]`.
pub(crate) fn paired(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    let min = r.iter().copied().fold(f64::INFINITY, f64::min);
    let max = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(r), min, max)
}

pub(crate) fn weir_binary(a: &Args) -> Result<PathBuf> {
    match a.weir.clone() {
        Some(p) => Ok(p),
        None => crate::build_weir(&crate::repo_root()),
    }
}

/// `compression-cpu`: prints a markdown table.
pub fn compression_main(a: Args, dir: &Path) -> Result<()> {
    let weir = weir_binary(&a)?;
    let nginx = process::find_program("nginx").context("nginx is not installed")?;
    let (_backend, backend) = json_backend(&nginx, dir)?;
    let keys = format!(
        "compression = {{ algorithms = [\"gzip\"], types = [\"application/json\"], min_size = \"1KiB\", level = {{ gzip = {} }} }}",
        a.level
    );
    let w = start_weir(&weir, dir, "gzip", backend, &keys, "")?;
    let n = start_nginx_gzip(&nginx, dir, backend, a.level)?;
    for p in [&w, &n] {
        let head = probe_head(p.addr, "/body.json", "gzip")?;
        if !head.contains("content-encoding: gzip") {
            bail!("{} did not compress:\n{head}", p.label);
        }
    }
    let (rw, rn) = alternate(&w, &n, &a, dir, &["Accept-Encoding: gzip"], "/body.json")?;
    let per_mib = |r: &Run| r.cpu_s / (r.bytes as f64 / f64::from(1 << 20));
    let per_req = |r: &Run| r.cpu_s / r.requests as f64 * 1e6;
    let (wm, nm): (Vec<f64>, Vec<f64>) = (
        rw.iter().map(per_mib).collect(),
        rn.iter().map(per_mib).collect(),
    );
    let (ratio, lo, hi) = paired(&wm, &nm);
    let resp = |r: &[Run]| r[0].bytes / r[0].requests.max(1);
    println!(
        "## compression-cpu: gzip level {}, ~100 KiB JSON from an nginx backend, wrk -c{} ({} s x {} pairs)\n\n\
         | proxy | response bytes (head + gzip body) | CPU ms per MiB out | CPU us per request | req/s |\n|---|---|---|---|---|",
        a.level, a.conns, a.duration, a.repeat
    );
    for (label, runs, m) in [(&w.label, &rw, &wm), (&n.label, &rn, &nm)] {
        let rps = median(
            runs.iter()
                .map(|r| r.requests as f64 / a.duration as f64)
                .collect(),
        );
        println!(
            "| {label} | {} | {:.1} | {:.0} | {rps:.0} |",
            resp(runs),
            median(m.clone()) * 1e3,
            median(runs.iter().map(per_req).collect()),
        );
    }
    println!("\nWeir / nginx CPU per MiB out, paired: {ratio:.3} ({lo:.3}-{hi:.3})");
    Ok(())
}

/// The redirect-free policy of `policy-cost`: every filter on, none refusing.
const POLICY_KEYS: &str = "request_headers = { set = { \"X-Env\" = \"prod\" }, remove = [\"X-Debug\"] }\n\
    response_headers = { set = { \"Strict-Transport-Security\" = \"max-age=63072000\" }, remove = [\"Server\"] }\n\
    rate_limit = { rate = \"1000000/s\", burst = 1000000 }\n\
    allow = [\"127.0.0.0/8\"]";

/// `policy-cost`: prints a markdown table.
pub fn policy_main(a: Args, dir: &Path) -> Result<()> {
    let weir = weir_binary(&a)?;
    let nginx = process::find_program("nginx").context("nginx is not installed")?;
    let backend = peers::start_nginx_backend(&nginx, LOAD_CPU, dir, "policy")?;
    let plain = start_weir(&weir, dir, "plain", backend.addrs[0], "", "")?;
    let policy = start_weir(&weir, dir, "policy", backend.addrs[0], POLICY_KEYS, "")?;
    println!(
        "## policy-cost: Weir CPU per request, 615 B nginx backend, wrk -c{} ({} s x {} pairs)\n",
        a.conns, a.duration, a.repeat
    );
    let (ra, rb) = alternate(&plain, &policy, &a, dir, &[], "/")?;
    print_pair("plain", "policy", &ra, &rb, a.duration);
    drop(policy);
    if let Some(base) = &a.weir_base {
        let old = start_weir(base, dir, "base", backend.addrs[0], "", "")?;
        let (ra, rb) = alternate(&old, &plain, &a, dir, &[], "/")?;
        print_pair(
            "plain, --weir-base",
            "plain, this build",
            &ra,
            &rb,
            a.duration,
        );
    }
    Ok(())
}

/// `tracing-cost`: prints a markdown table per sampling ratio against no `[tracing]`.
pub fn tracing_main(a: Args, dir: &Path) -> Result<()> {
    let weir = weir_binary(&a)?;
    let nginx = process::find_program("nginx").context("nginx is not installed")?;
    let backend = peers::start_nginx_backend(&nginx, LOAD_CPU, dir, "tracing")?;
    let plain = start_weir(&weir, dir, "plain", backend.addrs[0], "", "")?;
    let client = if a.h2c { "h2load h2c -m4" } else { "wrk" };
    println!(
        "## tracing-cost: Weir CPU per request, 615 B nginx backend, {client} -c{} ({} s x {} pairs)\n",
        a.conns, a.duration, a.repeat
    );
    for (tag, sampling) in [("sampling 0.01", 0.01), ("sampling 1.0", 1.0)] {
        // The exporter thread runs in Weir's process, so its CPU is counted with the
        // requests'; the collector is the backend (nginx answers any POST with 200).
        let table = format!(
            "[tracing]\nendpoint = \"http://{}/v1/traces\"\nsampling = {sampling}\n",
            backend.addrs[0]
        );
        let file_tag = format!("traced-{}", (sampling * 100.0) as u32);
        let traced = start_weir(&weir, dir, &file_tag, backend.addrs[0], "", &table)?;
        let (ra, rb) = alternate(&plain, &traced, &a, dir, &[], "/")?;
        print_pair("no [tracing]", tag, &ra, &rb, a.duration);
    }
    Ok(())
}

/// A table of two variants' CPU per request and the paired ratio second / first.
pub(crate) fn print_pair(first: &str, second: &str, ra: &[Run], rb: &[Run], secs: u64) {
    let per_req = |r: &Run| r.cpu_s / r.requests as f64 * 1e6;
    let p99 = |r: &Run| r.p99_us.unwrap_or(f64::NAN);
    let a: Vec<f64> = ra.iter().map(per_req).collect();
    let b: Vec<f64> = rb.iter().map(per_req).collect();
    println!("| route | CPU us per request | req/s | p99 |\n|---|---|---|---|");
    for (label, runs, m) in [(first, ra, &a), (second, rb, &b)] {
        let rps = median(
            runs.iter()
                .map(|r| r.requests as f64 / secs as f64)
                .collect(),
        );
        let p99 = median(runs.iter().map(p99).collect());
        println!(
            "| {label} | {:.2} | {rps:.0} | {:.2} ms |",
            median(m.clone()),
            p99 / 1e3
        );
    }
    let (ratio, lo, hi) = paired(&b, &a);
    println!("\n{second} / {first}, CPU per request, paired: {ratio:.4} ({lo:.4}-{hi:.4})");
    let (pa, pb): (Vec<f64>, Vec<f64>) =
        (ra.iter().map(p99).collect(), rb.iter().map(p99).collect());
    let (ratio, lo, hi) = paired(&pb, &pa);
    println!("{second} / {first}, p99 latency, paired: {ratio:.3} ({lo:.3}-{hi:.3})\n");
}
