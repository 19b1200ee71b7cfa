//! `weir-bench shared-limit`: how close a fleet of Weir instances keeps to a shared rate
//! limit (`rate_limit = { ..., shared = "main" }`, docs/cluster.md) at a few sync
//! intervals.
//!
//! For each `sync_interval`: a fresh `redis-server` (the test kit's), `instances` Weir
//! processes with one worker each and one route answering 200 under the limit `rate/s`,
//! `burst`, `key = "route"` (one count for the whole fleet), and `conns` keep-alive
//! clients per instance sending requests back to back for `duration` seconds, far above
//! the limit. The figure is the requests the fleet admitted (200) against what the limit
//! allows in that time (`rate x duration + burst`), and the most admitted in any one
//! second against `rate + burst`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::{self, Child, TempDir};

/// Arguments of `shared-limit`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The Weir binary (default: build target/release/weir with cargo first).
    #[arg(long)]
    pub weir: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    pub instances: usize,
    /// The limit, requests per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    #[arg(long, default_value_t = 20)]
    pub burst: u32,
    /// Sync intervals to measure, in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "50,200,1000")]
    pub intervals: Vec<u64>,
    /// Seconds of load per interval.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Keep-alive clients per instance.
    #[arg(long, default_value_t = 2)]
    pub conns: usize,
}

pub fn main(a: Args) -> Result<()> {
    let weir = match &a.weir {
        Some(p) => p.clone(),
        None => crate::build_weir(&crate::repo_root())?,
    };
    let dir = TempDir::new("weir-bench-shared-limit")?;
    println!(
        "{} instances, limit {}/s burst {}, {} s of load, {} clients per instance\n",
        a.instances, a.rate, a.burst, a.duration, a.conns
    );
    println!("| sync_interval | offered | admitted | allowed | overshoot | busiest second (allowed {}) |", a.rate + a.burst);
    println!("|---:|---:|---:|---:|---:|---:|");
    for &ms in &a.intervals {
        let r = measure(&a, &weir, &dir.0, Duration::from_millis(ms))?;
        let allowed = u64::from(a.rate) * a.duration + u64::from(a.burst);
        let over = r.admitted as f64 / allowed as f64 - 1.0;
        println!(
            "| {ms} ms | {} | {} | {allowed} | {:+} ({:+.1} %) | {} |",
            r.offered,
            r.admitted,
            r.admitted as i64 - allowed as i64,
            over * 100.0,
            r.busiest_second
        );
    }
    Ok(())
}

struct Outcome {
    offered: u64,
    admitted: u64,
    busiest_second: u64,
}

fn measure(a: &Args, weir: &Path, dir: &Path, interval: Duration) -> Result<Outcome> {
    let Some(redis) = weir_testkit::redis::RedisServer::start() else {
        bail!("redis-server is needed (apt-get install redis-server)");
    };
    let mut fleet = Vec::new();
    for i in 0..a.instances {
        fleet.push(start(a, weir, dir, i, &redis.url(), interval)?);
    }
    let addrs: Vec<SocketAddr> = fleet.iter().map(|(addr, _)| *addr).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let seconds = a.duration;
    let results = runtime.block_on(async {
        let started = Instant::now() + Duration::from_millis(200);
        let mut tasks = Vec::new();
        for addr in &addrs {
            for _ in 0..a.conns {
                tasks.push(tokio::spawn(client(*addr, started, seconds)));
            }
        }
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await);
        }
        all
    });
    let mut offered = 0;
    let mut per_second: BTreeMap<u64, u64> = BTreeMap::new();
    for r in results {
        let (sent, admitted) = r.context("client task")??;
        offered += sent;
        for (s, n) in admitted {
            *per_second.entry(s).or_default() += n;
        }
    }
    drop(fleet);
    Ok(Outcome {
        offered,
        admitted: per_second.values().sum(),
        busiest_second: per_second.values().copied().max().unwrap_or(0),
    })
}

/// Requests back to back on one connection from `start` for `seconds`: how many were
/// sent, and the 200s per second of the run.
async fn client(
    addr: SocketAddr,
    start: Instant,
    seconds: u64,
) -> Result<(u64, BTreeMap<u64, u64>)> {
    tokio::time::sleep_until(start.into()).await;
    let mut c = weir_testkit::Client::connect(addr).await?;
    let end = start + Duration::from_secs(seconds);
    let (mut sent, mut admitted) = (0, BTreeMap::new());
    while Instant::now() < end {
        let status = c.get("/", "bench").await?.status;
        sent += 1;
        if status == 200 {
            *admitted.entry(start.elapsed().as_secs()).or_insert(0) += 1;
        }
    }
    Ok((sent, admitted))
}

fn start(
    a: &Args,
    weir: &Path,
    dir: &Path,
    i: usize,
    redis: &str,
    interval: Duration,
) -> Result<(SocketAddr, Child)> {
    let port = process::free_port()?;
    let toml = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"bench\"\nbind = \"127.0.0.1:{port}\"\nkeepalive_requests = 0\n\
         request_id = false\n\
         [[listeners.routes]]\nname = \"limited\"\npath_prefix = \"/\"\n\
         respond = {{ status = 200, body = \"ok\" }}\n\
         rate_limit = {{ rate = \"{}/s\", burst = {}, key = \"route\", shared = \"main\" }}\n\
         [cluster.redis.main]\nurl = \"{redis}\"\nsync_interval = \"{}ms\"\n",
        a.rate,
        a.burst,
        interval.as_millis()
    );
    std::fs::write(dir.join(format!("weir-{i}.toml")), toml)?;
    process::spawn_weir(weir, dir, &i.to_string(), None, port)
}
