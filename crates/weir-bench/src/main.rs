//! weir-bench: reruns the seed benchmark reports with Weir side by side with nginx, HAProxy,
//! Caddy and Apache, each configured fairly (one worker, upstream keep-alive, logging off).
//!
//! `cargo run -p weir-bench --release -- <scenario>... [--quick] [--repeat N] [--out DIR]
//! [--weir PATH]`. The proxy under test is pinned to CPU 0; the backends, the load generator
//! and this harness run on CPU 1. See docs/benchmarks.md for the method.
//!
//! Modules: [`scenario`] (what each seed needs), [`runner`] (repetitions and measurement),
//! [`summary`] (medians, spreads, flags, ratios), [`bulk`] (`tcp-bulk`: one long L4 stream),
//! [`peers`], [`configs`] and [`backend`] (what runs), [`load`], [`wrk`], [`ab`], [`loadgen`]
//! and [`http1_client`] (the load side), [`procfs`] and [`stats`] (the figures), [`report`],
//! [`chart`] and [`envinfo`] (the output), [`process`] (children and their cleanup),
//! [`instructions`] (the instruction budgets CI checks).

mod ab;
mod backend;
mod bulk;
mod cache_cost;
mod chart;
mod configs;
mod envinfo;
mod h2load;
mod h3_cost;
mod h3_load;
mod handshakes;
mod http1_client;
mod instructions;
mod load;
mod loadgen;
mod peers;
mod policy_cost;
mod process;
mod procfs;
mod report;
mod runner;
mod scenario;
mod shared_limit;
mod stats;
mod summary;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

/// The CPU the proxy under test is pinned to.
pub const PROXY_CPU: usize = 0;
/// The CPU of the load generator, the backends and the harness.
pub const LOAD_CPU: usize = 1;

/// Benchmark Weir against nginx, HAProxy, Caddy and Apache (the seed experiments).
#[derive(Parser)]
#[command(name = "weir-bench", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    helper: Option<Helper>,
    /// Scenarios to run.
    #[arg(value_enum)]
    scenarios: Vec<scenario::Name>,
    /// Smoke test: 2 s per case, one repetition, fewer loads. Not a result.
    #[arg(long)]
    quick: bool,
    /// Repetitions per case (default 3; 1 with --quick).
    #[arg(long)]
    repeat: Option<u32>,
    /// Where results.md, results.json and the SVG charts go.
    #[arg(long, default_value = "target/weir-bench")]
    out: PathBuf,
    /// The Weir binary (default: build target/release/weir with cargo first).
    #[arg(long)]
    weir: Option<PathBuf>,
    /// Only these peers, comma-separated (direct, weir, weir-observed, weir-tcp, nginx,
    /// haproxy-http, haproxy-tcp, caddy, apache-event).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Seconds per measured run (default 10; 2 with --quick).
    #[arg(long)]
    duration: Option<u64>,
    /// Seconds of warm-up after a peer starts (default 2; 1 with --quick).
    #[arg(long)]
    warmup: Option<u64>,
}

#[derive(Subcommand)]
enum Helper {
    /// Internal: run test backends (started by the harness on the backend CPU).
    #[command(hide = true)]
    Backend(backend::Args),
    /// Internal: the open-loop fixed-rate generator (started on the load CPU).
    #[command(hide = true)]
    Loadgen(loadgen::Args),
    /// One TCP stream of several GiB through each L4 proxy: bytes per proxy CPU-second.
    TcpBulk(bulk::Args),
    /// Internal: the source of the tcp-bulk stream (started on the load CPU).
    #[command(hide = true)]
    BulkSource(bulk::SourceArgs),
    /// Weir gzip vs nginx gzip at the same level: CPU per MiB of compressed output.
    CompressionCpu(policy_cost::Args),
    /// Weir's CPU per request on a plain route vs a route with traffic policy.
    PolicyCost(policy_cost::Args),
    /// Weir's CPU per request without `[tracing]` vs 1 % and 100 % sampling.
    TracingCost(policy_cost::Args),
    /// Weir vs nginx proxy_cache vs Varnish: CPU per cache hit.
    CacheCost(policy_cost::Args),
    /// Weir vs Caddy: CPU per HTTP/3 request (an HTTP/3 client in this process).
    H3Cost(h3_cost::Args),
    /// Internal: new TLS connections, full or resumed (`tls-handshake`, on the load CPU).
    #[command(hide = true)]
    Handshakes(handshakes::Args),
    /// User-space instructions per request under callgrind, checked against the budgets
    /// (bench/instructions.sh).
    Instructions(instructions::Args),
    /// How far a fleet of instances goes past a shared rate limit (Redis), per sync
    /// interval.
    SharedLimit(shared_limit::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.helper {
        Some(Helper::Backend(a)) => backend::main(a),
        Some(Helper::Loadgen(a)) => loadgen::main(a),
        Some(Helper::TcpBulk(a)) => tcp_bulk(a),
        Some(Helper::BulkSource(a)) => bulk::source_main(a),
        Some(Helper::CompressionCpu(a)) => cost(a, policy_cost::compression_main),
        Some(Helper::PolicyCost(a)) => cost(a, policy_cost::policy_main),
        Some(Helper::TracingCost(a)) => cost(a, policy_cost::tracing_main),
        Some(Helper::CacheCost(a)) => cost(a, cache_cost::main),
        Some(Helper::H3Cost(a)) => in_temp_dir(|dir| h3_cost::main(a, dir)),
        Some(Helper::Handshakes(a)) => handshakes::main(a),
        Some(Helper::Instructions(a)) => instructions::main(a),
        Some(Helper::SharedLimit(a)) => shared_limit::main(a),
        None => bench(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn repo_root() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    p.canonicalize().unwrap_or(p)
}

/// Builds Weir in release mode (a no-op when it is up to date) and returns its path.
fn build_weir(root: &Path) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("weir-bench: cargo build --release -p weir");
    let st = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "weir"])
        .status()
        .context("run cargo")?;
    if !st.success() {
        bail!("cargo build --release -p weir failed");
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(target.join("release/weir"))
}

/// `tcp-bulk`: set up like a scenario run, then the bulk transfers.
/// Runs one of `policy_cost`'s subcommands in a scratch directory.
fn cost(a: policy_cost::Args, run: fn(policy_cost::Args, &Path) -> Result<()>) -> Result<()> {
    in_temp_dir(|dir| run(a, dir))
}

/// Runs `f` pinned to the load CPU with a temporary directory for its files.
fn in_temp_dir(f: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    process::install_cleanup();
    process::raise_fd_limit();
    process::pin_self(LOAD_CPU);
    let tmp = process::TempDir::new("weir-bench-cost")?;
    f(&tmp.0)
}

fn tcp_bulk(a: bulk::Args) -> Result<()> {
    process::install_cleanup();
    process::raise_fd_limit();
    let weir = match a.weir.clone() {
        Some(p) => p,
        None => build_weir(&repo_root())?,
    };
    process::pin_self(LOAD_CPU);
    let tmp = process::TempDir::new("weir-bench-bulk")?;
    bulk::main(a, weir, &tmp.0)
}

fn bench(cli: Cli) -> Result<()> {
    if cli.scenarios.is_empty() {
        bail!("name one or more scenarios: proxy-1core, cgi-prefix, default-backend, round-robin, latency, all");
    }
    let mut names = Vec::new();
    for n in &cli.scenarios {
        let expand: &[scenario::Name] = if *n == scenario::Name::All {
            &scenario::Name::EVERY
        } else {
            std::slice::from_ref(n)
        };
        for n in expand {
            if !names.contains(n) {
                names.push(*n);
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        bail!("needs 2 CPUs (proxy on CPU {PROXY_CPU}, load on CPU {LOAD_CPU}); this machine has {cores}");
    }
    if cfg!(debug_assertions) {
        eprintln!("weir-bench: warning: a debug build; run with --release (the open-loop generator is this binary)");
    }
    process::install_cleanup();
    process::raise_fd_limit();
    let root = repo_root();
    let weir = match cli.weir {
        Some(p) => p,
        None => build_weir(&root)?,
    };
    // After the build (which should have both cores): keep the harness off the proxy's core.
    process::pin_self(LOAD_CPU);
    let quick = cli.quick;
    let opts = runner::Opts {
        quick,
        repeat: cli.repeat.unwrap_or(if quick { 1 } else { 3 }).max(1),
        secs: cli.duration.unwrap_or(if quick { 2 } else { 10 }).max(1),
        warmup: cli.warmup.unwrap_or(if quick { 1 } else { 2 }),
        weir,
        only: cli.peers,
    };
    let tmp = process::TempDir::new("weir-bench")?;
    let tools = load::Tools::new(tmp.0.clone())?;
    let env = envinfo::collect(&opts.weir, &root);
    let mut results = Vec::new();
    for n in names {
        let sc = scenario::build(n, quick);
        eprintln!("weir-bench: scenario {} (seed {})", sc.name, sc.seeds);
        results.push(runner::run(&sc, &opts, &tools, &tmp.0));
    }
    let r = report::Report {
        env: &env,
        options: &opts,
        scenarios: &results,
    };
    let md = report::markdown(&r);
    print!("{md}");
    for f in report::write_all(&cli.out, &r, &md)? {
        eprintln!("weir-bench: wrote {f}");
    }
    Ok(())
}
