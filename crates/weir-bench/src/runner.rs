//! Running a scenario: start every peer on the proxy CPU (each on its own port; a peer
//! without load costs nothing), check that each answers correctly and warm it up, then for
//! each repetition and each load measure the peers one after the other, and stop them all.
//!
//! Interleaving peers per load keeps the runs being compared a few seconds apart: the
//! machines this runs on are shared, and their speed drifts in phases of tens of seconds, so
//! running one peer through every load before the next (minutes apart) turned drift into
//! false differences. Per measured run the proxy's CPU time and peak RSS come from `/proc`,
//! the generator's CPU from `wait4`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::backend::{self, BackendKind};
use crate::load::{self, Load, LoadOutput, Tools};
use crate::peers::{self, Peer, Route, TlsFiles};
use crate::process::{self, Child};
use crate::procfs;
use crate::scenario::Scenario;
use crate::summary::{flags, metrics_verdict, rate_flag, ratios, summarise, Case, Ratio};
use crate::{LOAD_CPU, PROXY_CPU};

/// Harness options.
#[derive(Debug, Clone, Serialize)]
pub struct Opts {
    pub quick: bool,
    pub repeat: u32,
    pub secs: u64,
    pub warmup: u64,
    pub weir: PathBuf,
    /// Only these peers (by name); empty = all.
    pub only: Vec<String>,
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Which repetition (from 0): samples of different peers with the same repetition and
    /// load were measured seconds apart.
    pub repetition: u32,
    #[serde(flatten)]
    pub load: LoadOutput,
    /// The proxy's (for `direct`: the backend's) utime + stime per request, microseconds.
    pub cpu_per_req_us: Option<f64>,
    /// The user-space part of `cpu_per_req_us` (utime alone); the rest is kernel time.
    pub user_per_req_us: Option<f64>,
    /// Percent of one core, over the run's wall time.
    pub proxy_cpu_pct: f64,
    pub peak_rss_mib: Option<f64>,
    pub gen_cpu_pct: f64,
    pub backend_cpu_pct: Option<f64>,
    /// Task time on the proxy CPU not accounted for by the proxy (other processes).
    pub cpu0_other_pct: Option<f64>,
    pub metrics: Option<String>,
    /// The proxy's voluntary context switches (blocking waits) per request.
    pub sleeps_per_req: Option<f64>,
}

/// Everything one scenario produced.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub backend: String,
    pub cases: Vec<Case>,
    pub ratios: Vec<Ratio>,
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// Runs `sc` and summarises it. Failures of single peers become notes.
pub fn run(sc: &Scenario, opts: &Opts, tools: &Tools, dir: &Path) -> ScenarioResult {
    let started = Instant::now();
    let mut notes = Vec::new();
    let loads: Vec<Load> = sc
        .loads
        .iter()
        .filter(|l| match tools.missing(l) {
            Some(why) => {
                notes.push(format!("{} skipped: {why}", l.label()));
                false
            }
            None => true,
        })
        .copied()
        .collect();
    let mut peers = Vec::new();
    for &p in &sc.peers {
        if !opts.only.is_empty() && !opts.only.iter().any(|o| o == p.name()) {
            continue;
        }
        match peers::program(p, &opts.weir) {
            Ok(_) => peers.push(p),
            Err(why) => notes.push(format!("{} skipped: {why}", p.name())),
        }
    }
    let mut result = ScenarioResult {
        scenario: sc.clone(),
        backend: String::new(),
        cases: Vec::new(),
        ratios: Vec::new(),
        notes,
        seconds: 0.0,
    };
    let backend = match backend::start(sc.backend, LOAD_CPU, dir, "main") {
        Ok(b) => b,
        Err(e) => {
            result.notes.push(format!("backend failed to start: {e:#}"));
            return result;
        }
    };
    result.backend = backend
        .as_ref()
        .map_or("none (the proxy answers)".into(), |b| {
            format!("{}, pinned to CPU {LOAD_CPU}", b.about)
        });
    // One certificate for every peer of a TLS scenario; its files live as long as `cert`.
    let rsa = sc
        .loads
        .iter()
        .any(|l| matches!(l, Load::Handshake { kind, .. } if kind.rsa));
    let cert = sc.tls.then(|| Certificate::new(rsa));
    let tls = cert.as_ref().map(|c| &c.files);
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); loads.len()]; peers.len()];
    let mut targets: Vec<Option<Target>> = Vec::new();
    for &peer in &peers {
        eprintln!("[{}] starting {}", sc.name, peer.name());
        let fixture = Fixture {
            dir,
            tls,
            backend: backend.as_ref(),
        };
        let started = start_target(sc, peer, &loads, opts, tools, &fixture);
        targets.push(match started {
            Ok((t, note)) => {
                result.notes.extend(note);
                Some(t)
            }
            Err(e) => {
                result.notes.push(format!("{} skipped: {e:#}", peer.name()));
                None
            }
        });
    }
    let backend_pgid = backend.as_ref().map(|b| b.child.pgid);
    for rep in 0..opts.repeat {
        for (li, load) in loads.iter().enumerate() {
            eprintln!(
                "[{}] repetition {}/{}: {}",
                sc.name,
                rep + 1,
                opts.repeat,
                load.label()
            );
            // The first peer moves by one each repetition, so no peer always runs right
            // after the same neighbour (TIME_WAIT sockets, backend state, drift).
            for pi in (0..peers.len()).map(|i| (i + rep as usize) % peers.len()) {
                let peer = peers[pi];
                let Some(t) = targets[pi].as_mut() else {
                    continue;
                };
                // `direct` is the backend itself: no separate backend CPU to count.
                let be = backend_pgid.filter(|_| peer != Peer::Direct);
                match measure(load, sc, opts, tools, t, be) {
                    Ok(s) => samples[pi][li].push(Sample {
                        repetition: rep,
                        ..s
                    }),
                    Err(e) => result.notes.push(format!(
                        "{} {}: run failed: {e:#}",
                        peer.name(),
                        load.label()
                    )),
                }
            }
        }
    }
    drop(targets);
    drop(backend);
    for (pi, &peer) in peers.iter().enumerate() {
        for (li, load) in loads.iter().enumerate() {
            let s = std::mem::take(&mut samples[pi][li]);
            if s.is_empty() {
                continue;
            }
            let summary = summarise(&s);
            let mut flags = flags(peer, &summary, sc.expect_status);
            flags.extend(rate_flag(load, &summary));
            result.cases.push(Case {
                peer,
                peer_name: peer.name(),
                load: *load,
                label: load.label(),
                samples: s,
                summary,
                flags,
            });
        }
    }
    result.ratios = ratios(&result.cases);
    result.seconds = started.elapsed().as_secs_f64();
    result
}

/// The ECDSA P-256 certificate (rcgen's default key type) of a TLS scenario, for
/// `localhost`, signed by a throwaway CA whose PEM file the check request trusts; with
/// `rsa`, also an RSA-2048 one for `handshakes::RSA_NAME`. Each also as the one file
/// (chain, then key) HAProxy loads.
struct Certificate {
    /// Owns the directory the files are in (removed on drop).
    _dir: weir_testkit::certs::TestCa,
    files: TlsFiles,
}

impl Certificate {
    fn new(rsa: bool) -> Certificate {
        let ca = weir_testkit::certs::TestCa::new("weir-bench CA");
        let leaf = ca.leaf(&["localhost"]);
        let rsa = rsa.then(|| ca.leaf_rsa(&[crate::handshakes::RSA_NAME]));
        for l in std::iter::once(&leaf).chain(rsa.as_ref()) {
            let combined = format!("{}{}", l.chain_pem, l.key_pem);
            if let Err(e) = std::fs::write(peers::haproxy_pem(&l.cert_path), combined) {
                eprintln!("weir-bench: cannot write HAProxy's certificate file: {e}");
            }
        }
        Certificate {
            files: TlsFiles {
                cert: leaf.cert_path,
                key: leaf.key_path,
                ca: ca.cert_path.clone(),
                rsa: rsa.map(|l| (l.cert_path, l.key_path)),
            },
            _dir: ca,
        }
    }
}

/// The status of `GET path` over TLS (trusting the bench CA), for the check request.
fn tls_status(addr: SocketAddr, path: &str, ca: &Path) -> Result<u16> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut client = weir_testkit::Client::connect_tls(addr, "localhost", ca).await?;
        Ok(client.get(path, "localhost").await?.status)
    })
}

/// The system under test of one peer run: what to send load to, and whose CPU to count.
struct Target {
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    child: Child,
}

/// What every peer of one scenario runs against, started once for all of them.
struct Fixture<'a> {
    /// The scenario's working directory (configs, logs).
    dir: &'a Path,
    /// The certificate every peer serves, in a TLS scenario.
    tls: Option<&'a TlsFiles>,
    /// The backend the peers forward to, if the scenario has one.
    backend: Option<&'a backend::Running>,
}

/// Starts `peer` on the proxy CPU, checks its answer and warms it up at the heaviest load.
/// Also returns a note on what the check found, if anything.
fn start_target(
    sc: &Scenario,
    peer: Peer,
    loads: &[Load],
    opts: &Opts,
    tools: &Tools,
    fixture: &Fixture,
) -> Result<(Target, Option<String>)> {
    let Fixture { dir, tls, backend } = *fixture;
    let backends: Vec<SocketAddr> = backend.map(|b| b.addrs.clone()).unwrap_or_default();
    // Pools are sized by requests in flight: h2 c=32 m=16 keeps 512 upstream requests
    // going, which an idle pool sized for 32 connections (128) closes and reopens.
    let max_conns = loads.iter().map(Load::in_flight).max().unwrap_or(64);
    let t = if peer == Peer::Direct {
        // The backend alone on the proxy CPU: the cost floor a proxy is compared with.
        let kind = match sc.backend {
            BackendKind::Echo { .. } => BackendKind::Echo { count: 1 },
            k => k,
        };
        let Some(b) = backend::start(kind, PROXY_CPU, dir, "direct")? else {
            bail!("no backend to measure directly");
        };
        Target {
            addr: b.addrs[0],
            admin: None,
            child: b.child,
        }
    } else {
        let setup = peers::Setup {
            dir,
            backends: &backends,
            route: sc.route,
            max_conns,
            weir: &opts.weir,
            admin: sc.check_metrics,
            tls,
        };
        let s = peers::start(peer, &setup, PROXY_CPU)?;
        Target {
            addr: s.addr,
            admin: s.admin,
            child: s.child,
        }
    };
    let note = match tls {
        None if sc.route.h2c_front() => verify_h2c(sc, tools, &t)?,
        None => verify(sc, peer, &t, backends.len())?,
        Some(files) => {
            let status = tls_status(t.addr, sc.path, &files.ca)?;
            if status != sc.expect_status {
                bail!("answered {status} over TLS instead of {}", sc.expect_status);
            }
            None
        }
    };
    let heaviest = loads.iter().max_by_key(|l| l.conns()).copied();
    if let (Some(w), true) = (heaviest, opts.warmup > 0) {
        load::run(&w, tools, t.addr, sc.tls, sc.path, opts.warmup)?;
    }
    Ok((t, note))
}

/// h2c peers (no HTTP/1.1 on their port): a few requests with h2load, every one a 2xx.
fn verify_h2c(sc: &Scenario, tools: &Tools, t: &Target) -> Result<Option<String>> {
    let h2load = tools
        .h2load
        .clone()
        .ok_or_else(|| anyhow::anyhow!("h2load is not installed"))?;
    let url = format!("http://{}{}", t.addr, sc.path);
    let mut args = crate::h2load::check_args(4, &url);
    if sc.route == Route::Grpc {
        args.extend(crate::h2load::grpc_args(&tools.dir));
    }
    let out = std::process::Command::new(h2load).args(&args).output()?;
    let parsed = crate::h2load::parse(&String::from_utf8_lossy(&out.stdout))?;
    if parsed.requests != 4 || parsed.non2xx > 0 || parsed.errors > 0 {
        bail!("h2c check: {parsed:?}");
    }
    Ok(None)
}

/// One request through the peer before measuring: right status, prefix rewritten, and (with
/// several backends) every backend reached (a note when not).
fn verify(sc: &Scenario, peer: Peer, t: &Target, n_backends: usize) -> Result<Option<String>> {
    let p = process::http_get(t.addr, sc.path)?;
    if p.status != sc.expect_status {
        bail!(
            "answered {} instead of {} for {}",
            p.status,
            sc.expect_status,
            sc.path
        );
    }
    if sc.route == Route::Prefix && peer != Peer::Direct && !p.body.starts_with(b"GET /cgi-bin/") {
        bail!(
            "prefix not rewritten: backend saw {:?}",
            String::from_utf8_lossy(&p.body[..p.body.len().min(40)])
        );
    }
    if n_backends > 1 && peer != Peer::Direct {
        let mut seen = BTreeSet::new();
        for _ in 0..n_backends * 2 {
            let p = process::http_get(t.addr, sc.path)?;
            seen.insert(p.header("x-backend").unwrap_or("?").to_string());
        }
        if seen.len() < n_backends {
            return Ok(Some(format!(
                "{}: round robin reached only {seen:?}",
                peer.name()
            )));
        }
    }
    Ok(None)
}

/// Sum of the samples of `weir_requests_total` (every request a listener answered), from `/metrics`,
/// once no client connection is open (so requests a previous load abandoned mid-flight are
/// counted before, not during, the next run). Gives up waiting after 5 s.
fn scrape_requests(admin: SocketAddr) -> Option<f64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let text = scrape(admin)?;
        let open = sum_series(&text, |name| name == "weir_connections_active");
        if open == 0.0 || std::time::Instant::now() > deadline {
            return Some(sum_series(&text, |name| name == "weir_requests_total"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn scrape(admin: SocketAddr) -> Option<String> {
    let p = process::http_get(admin, "/metrics").ok()?;
    (p.status == 200).then(|| String::from_utf8_lossy(&p.body).into_owned())
}

/// Sum of the samples of the metrics whose name satisfies `pick`.
fn sum_series(text: &str, pick: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let metric = name.split('{').next()?;
            pick(metric).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn measure(
    l: &Load,
    sc: &Scenario,
    opts: &Opts,
    tools: &Tools,
    t: &mut Target,
    backend_pgid: Option<i32>,
) -> Result<Sample> {
    let pgid = t.child.pgid;
    if let Some(st) = t.child.exited() {
        bail!("{} exited ({st}): {}", t.child.name, t.child.log_tail());
    }
    procfs::reset_peak_rss(pgid);
    let metrics_before = t.admin.and_then(scrape_requests);
    let cpu0_a = procfs::cpu_times(PROXY_CPU);
    let (user_a, system_a) = procfs::group_cpu_split(pgid);
    let sleeps_a = procfs::group_sleeps(pgid);
    let be_a = backend_pgid.map(procfs::group_cpu_secs);
    let t0 = Instant::now();
    let (out, gen_cpu) = load::run(l, tools, t.addr, sc.tls, sc.path, opts.secs)?;
    let wall = t0.elapsed().as_secs_f64().max(1e-9);
    let (user_b, system_b) = procfs::group_cpu_split(pgid);
    let sut_user = user_b - user_a;
    let sut_cpu = sut_user + (system_b - system_a);
    let sleeps = procfs::group_sleeps(pgid).saturating_sub(sleeps_a);
    let be_cpu = backend_pgid
        .map(procfs::group_cpu_secs)
        .zip(be_a)
        .map(|(b, a)| b - a);
    let cpu0_other = cpu0_a.zip(procfs::cpu_times(PROXY_CPU)).map(|(a, b)| {
        let ticks = b.task_ticks().saturating_sub(a.task_ticks()) as f64 / procfs::clk_tck();
        ((ticks - sut_cpu) / wall * 100.0).max(0.0)
    });
    let metrics = match (metrics_before, t.admin.and_then(scrape_requests)) {
        (Some(a), Some(b)) => Some(metrics_verdict(b - a, out.requests, l.conns())),
        _ if sc.check_metrics && t.admin.is_some() => Some("no /metrics yet".into()),
        _ => None,
    };
    Ok(Sample {
        repetition: 0,
        cpu_per_req_us: (out.requests > 0).then(|| sut_cpu / out.requests as f64 * 1e6),
        user_per_req_us: (out.requests > 0).then(|| sut_user / out.requests as f64 * 1e6),
        proxy_cpu_pct: sut_cpu / wall * 100.0,
        peak_rss_mib: procfs::group_peak_rss_kib(pgid).map(|k| k as f64 / 1024.0),
        gen_cpu_pct: gen_cpu / wall * 100.0,
        backend_cpu_pct: be_cpu.map(|c| c / wall * 100.0),
        cpu0_other_pct: cpu0_other,
        metrics,
        sleeps_per_req: (out.requests > 0).then(|| sleeps as f64 / out.requests as f64),
        load: out,
    })
}
