//! `weir-bench instructions`: user-space instructions per request of a fixed set of
//! workloads, checked against the budgets kept in the repository (`bench/instructions.sh`,
//! run by CI; docs/benchmarks.md, "Instruction budgets").
//!
//! Each workload runs Weir under `valgrind --tool=callgrind` and sends it requests one at a
//! time, each once Weir's worker sleeps ([`idle`]); the counters are zeroed after a warm-up
//! (start-up, the keep-alive connection's set-up, the first allocations) and dumped after the
//! counted requests, whose total over their number is the figure. Instruction counts do not
//! depend on the machine's load the way times do, so they can gate a change. Weir's
//! configuration is the default one (one worker, one route, every default on), with the admin
//! listener off (it serves no requests here), no drain on exit and no cap on a keep-alive
//! connection's requests (so that no connection set-up is spread over the keep-alive
//! requests: handshakes have a workload of their own).

mod budgets;
mod callgrind;
mod drive;
mod idle;
mod loaded;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::handshakes::Profile;
use budgets::{Budget, Budgets};
use callgrind::Functions;
use drive::Client;

/// Arguments of the `instructions` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The budgets file; the stored function profiles are in `instruction-profiles/` beside it.
    #[arg(long, default_value = "bench/instruction-budgets.toml")]
    pub budgets: PathBuf,
    /// The Weir binary to count (bench/instructions.sh builds `--profile instructions`, the
    /// profile the budgets are counted on).
    #[arg(long)]
    pub weir: PathBuf,
    /// Only these workloads, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write the measured figures as the budgets (and their function profiles).
    #[arg(long)]
    pub update: bool,
    /// Extra keys for the listener, as TOML lines (`request_id = false`): what a setting
    /// costs. Not with `--update` (budgets are counted on the default configuration).
    #[arg(long, default_value = "")]
    pub listener_keys: String,
    /// Extra keys for the route, as TOML lines (`forwarded_headers = false`).
    #[arg(long, default_value = "")]
    pub route_keys: String,
    /// Extra tables after the config, as TOML (`[cluster.redis.r]` for a route's
    /// `rate_limit = { ..., shared = "r" }`).
    #[arg(long, default_value = "")]
    pub tables: String,
    /// What the TLS workloads' client offers instead of their own (`tls-keepalive`: an
    /// OpenSSL client's, as wrk's; `tls-handshake`: a browser's). Not with `--update`.
    #[arg(long, value_enum)]
    pub tls_client: Option<Profile>,
    /// Measurements per workload (to see how stable the count is); the figure is the lowest.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Count as issue 25 does instead of checking budgets: the HTTP/1 workloads under an
    /// `h2load --h1` keep-alive load over each of these numbers of connections (`4,32`),
    /// the default `keepalive_requests`; needs h2load. Not with `--update`.
    #[arg(long, value_delimiter = ',')]
    pub under_load: Vec<u32>,
}

/// A workload goes over its budget when it costs more than this much above it.
const TOLERANCE: f64 = 0.02;
/// How many grown functions are printed for a workload over its budget.
const TOP_GROWN: usize = 15;

/// What answers the requests.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    /// Proxied to the 615-byte backend.
    Proxy,
    /// Answered by Weir itself (`respond`).
    Local,
}

/// One workload: a listener, a route and a load.
struct Workload {
    name: &'static str,
    tls: bool,
    route: Route,
    client: Client,
    /// Warm-up requests, then the counted ones.
    requests: (u64, u64),
}

const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "http1-proxy",
        tls: false,
        route: Route::Proxy,
        client: Client::Http1,
        requests: (1_000, 10_000),
    },
    Workload {
        name: "http1-local",
        tls: false,
        route: Route::Local,
        client: Client::Http1,
        requests: (1_000, 10_000),
    },
    Workload {
        name: "h2c-stream",
        tls: false,
        route: Route::Proxy,
        client: Client::H2c,
        requests: (1_000, 10_000),
    },
    Workload {
        name: "tls-keepalive",
        tls: true,
        route: Route::Proxy,
        client: Client::Tls(Profile::Openssl),
        requests: (1_000, 10_000),
    },
    Workload {
        name: "tls-handshake",
        tls: true,
        route: Route::Local,
        client: Client::Handshake(Profile::Browser),
        requests: (20, 200),
    },
];

/// How the requests are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    /// One at a time, each once the worker sleeps (the budgets' count).
    OneAtATime,
    /// `h2load --h1` over this many connections (issue 25's count).
    H2load(u32),
}

/// What one workload costs per request: the lowest of the repetitions, with its function
/// profile and how often the worker parked, and the highest.
struct Measured {
    per_request: f64,
    functions: Functions,
    /// The worker's calls of `epoll_wait` per request: tokio parks when it has no task
    /// to run (sleeping there unless an event is ready).
    parks: f64,
    highest: f64,
}

/// What the runs share: the binary, the backend, the certificate and a scratch directory.
struct Bench<'a> {
    weir: &'a Path,
    backend: SocketAddr,
    cert: &'a weir_testkit::certs::Leaf,
    dir: &'a Path,
    listener_keys: &'a str,
    route_keys: &'a str,
    tables: &'a str,
    tls_client: Option<Profile>,
}

pub fn main(a: Args) -> Result<()> {
    for tool in ["valgrind", "callgrind_annotate"] {
        if crate::process::find_program(tool).is_none() {
            bail!("{tool} is not installed (Debian: apt-get install valgrind)");
        }
    }
    if a.update
        && !(a.listener_keys.is_empty()
            && a.route_keys.is_empty()
            && a.tables.is_empty()
            && a.under_load.is_empty())
    {
        bail!(
            "--update counts the default configuration one request at a time: leave out \
             --listener-keys, --route-keys, --tables and --under-load"
        );
    }
    crate::process::install_cleanup();
    let mut budgets = Budgets::read(&a.budgets)?;
    let tmp = crate::process::TempDir::new("weir-bench-instructions")?;
    let ca = weir_testkit::certs::TestCa::new("weir-bench instructions CA");
    let cert = ca.leaf(&["localhost"]);
    let backend = nginx_like_backend();
    let bench = Bench {
        weir: &a.weir,
        backend: backend.addr(),
        cert: &cert,
        dir: &tmp.0,
        listener_keys: &a.listener_keys,
        route_keys: &a.route_keys,
        tables: &a.tables,
        tls_client: a.tls_client,
    };
    if !a.under_load.is_empty() {
        return under_load(&bench, &a);
    }
    let commit = commit_here();
    let mut over = Vec::new();
    let mut owned = Vec::new();
    println!("| workload | budget | measured | change | set at | repetitions (min-max) |\n|---|---:|---:|---:|---|---|");
    for w in WORKLOADS
        .iter()
        .filter(|w| a.only.is_empty() || a.only.iter().any(|o| o == w.name))
    {
        let m = measure(&bench, w, Load::OneAtATime, a.repeat)
            .with_context(|| format!("workload {}", w.name))?;
        let budget = budgets.get(w.name)?;
        let spread = format!(
            "{} ({:.0}-{:.0})",
            a.repeat.max(1),
            m.per_request,
            m.highest
        );
        println!("{} {spread} |", row(w.name, budget.as_ref(), m.per_request));
        owned.push((
            w.name,
            Load::OneAtATime,
            m.per_request,
            m.parks,
            m.functions.clone(),
        ));
        if budget
            .as_ref()
            .is_some_and(|b| m.per_request > b.instructions * (1.0 + TOLERANCE))
        {
            over.push((w.name, m.functions.clone()));
        }
        if a.update {
            let b = Budget {
                instructions: m.per_request,
                commit: commit.clone(),
            };
            budgets.set(w.name, &b);
            budgets.write_profile(w.name, &commit, &m.functions)?;
        }
    }
    print_owners(&owned);
    if a.update {
        budgets.write()?;
        println!(
            "\nbudgets written to {} (commit {commit})",
            a.budgets.display()
        );
        return Ok(());
    }
    for (name, functions) in &over {
        print_grown(name, &budgets.profile(name), functions);
    }
    if !over.is_empty() {
        let names: Vec<&str> = over.iter().map(|(n, _)| *n).collect();
        bail!(
            "over budget by more than {:.0} %: {} (docs/benchmarks.md, \"Instruction budgets\")",
            TOLERANCE * 100.0,
            names.join(", ")
        );
    }
    Ok(())
}

/// One row of the count by owner: workload, load, per request, parks per request, profile.
type Owned = (&'static str, Load, f64, f64, Functions);

/// Issue 25's count: the HTTP/1 workloads under h2load over each number of connections.
fn under_load(bench: &Bench, a: &Args) -> Result<()> {
    let mut owned = Vec::new();
    for w in WORKLOADS.iter().filter(|w| {
        w.client == Client::Http1 && (a.only.is_empty() || a.only.iter().any(|o| o == w.name))
    }) {
        for &conns in &a.under_load {
            let load = Load::H2load(conns);
            let m = measure(bench, w, load, a.repeat)
                .with_context(|| format!("workload {} under load", w.name))?;
            owned.push((w.name, load, m.per_request, m.parks, m.functions));
        }
    }
    print_owners(&owned);
    for (name, load, _, _, functions) in &owned {
        print_top(name, *load, functions);
    }
    Ok(())
}

/// How many functions [`print_top`] lists.
const TOP: usize = 25;

/// The functions that cost most per request (exclusive), with their owners.
fn print_top(name: &str, load: Load, functions: &Functions) {
    let mut rows: Vec<(&String, f64)> = functions.iter().map(|(f, v)| (f, *v)).collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("\n{name}, {load:?}: the {TOP} costliest functions per request (exclusive)");
    println!("| per request | owner | function |\n|---:|---|---|");
    for (f, v) in rows.into_iter().take(TOP) {
        println!("| {v:.0} | {} | `{f}` |", loaded::owner_of(f));
    }
}

/// Instructions per request by owner, and how often the worker parked per request.
fn print_owners(rows: &[Owned]) {
    println!(
        "\n| workload | load | per request | `epoll_wait` per request | {} |\n|---|---|---:|---:|{}",
        loaded::OWNERS.join(" | "),
        "---:|".repeat(loaded::OWNERS.len())
    );
    for (name, load, per_request, parks, functions) in rows {
        let load = match load {
            Load::OneAtATime => "one at a time".to_string(),
            Load::H2load(c) => format!("h2load --h1 -c {c}"),
        };
        let split: Vec<String> = loaded::owners(functions)
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect();
        println!(
            "| {name} | {load} | {per_request:.0} | {parks:.2} | {} |",
            split.join(" | ")
        );
    }
}

/// nginx's answer to the `proxy-1core` backend's `return 200`: the same fields and 615 bytes
/// (the date fixed, so that every run parses the same bytes).
fn nginx_like_backend() -> weir_testkit::Backend {
    let headers = [
        ("Server", "nginx/1.22.1"),
        ("Date", "Thu, 26 Nov 2026 12:00:00 GMT"),
        ("Content-Type", "application/octet-stream"),
        ("Connection", "keep-alive"),
    ];
    weir_testkit::Backend::fixed(200, &headers, &crate::backend::body_615())
}

/// Instructions per request of `w`, measured `repeat` times; the lowest counts (the
/// highest is kept to show the spread).
fn measure(bench: &Bench, w: &Workload, load: Load, repeat: u32) -> Result<Measured> {
    let mut best: Option<Measured> = None;
    let mut highest = 0f64;
    for _ in 0..repeat.max(1) {
        let m = measure_once(bench, w, load)?;
        highest = highest.max(m.per_request);
        if best.as_ref().is_none_or(|b| m.per_request < b.per_request) {
            best = Some(m);
        }
    }
    let mut best = best.expect("at least one repetition");
    best.highest = highest;
    Ok(best)
}

/// One measurement: the counted requests' total and functions, each over their number.
fn measure_once(bench: &Bench, w: &Workload, load: Load) -> Result<Measured> {
    let port = crate::process::free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let config = bench.dir.join(format!("{}.toml", w.name));
    std::fs::write(&config, weir_config(bench, w, port, load))?;
    let out = bench.dir.join(format!("{}.callgrind", w.name));
    let counted = callgrind::Counted::start(bench.weir, &config, addr, &out)?;
    let idle = idle::Idle::of(counted.pid())?;
    let zero = || counted.zero();
    let (warmup, requests) = match load {
        Load::OneAtATime => w.requests,
        Load::H2load(_) => (loaded::WARMUP, loaded::COUNTED),
    };
    match load {
        Load::OneAtATime => one_at_a_time(bench, w, addr, &idle, &zero)?,
        Load::H2load(conns) => {
            loaded::h2load(addr, conns, warmup)?;
            idle.wait()?;
            zero()?;
            loaded::h2load(addr, conns, requests)?;
            idle.wait()?;
        }
    }
    let profile = counted.dump()?;
    counted.stop()?;
    let n = requests as f64;
    let per_request = profile.total()? as f64 / n;
    let parks = profile.calls_to("epoll_wait")? as f64 / n;
    let functions = profile
        .functions()?
        .into_iter()
        .map(|(k, v)| (k, v / n))
        .collect();
    // Kept with the scratch directory for a closer look (`callgrind_annotate`).
    if std::env::var_os("WEIR_BENCH_KEEP_TMP").is_none() {
        std::fs::remove_file(&profile.0).ok();
        std::fs::remove_file(&out).ok();
    }
    Ok(Measured {
        per_request,
        functions,
        parks,
        highest: 0.0,
    })
}

/// The budgets' load: `w`'s requests one at a time, each once the worker sleeps, the
/// counters zeroed after the warm-up.
fn one_at_a_time(
    bench: &Bench,
    w: &Workload,
    addr: SocketAddr,
    idle: &idle::Idle,
    zero: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let (warmup, requests) = w.requests;
    let mut steps = drive::Steps::new(idle, warmup, zero);
    let client = match (w.client, bench.tls_client) {
        (Client::Tls(_), Some(p)) => Client::Tls(p),
        (Client::Handshake(_), Some(p)) => Client::Handshake(p),
        (client, _) => client,
    };
    drive::run(client, addr, &mut steps, warmup + requests)
}

/// Weir's configuration for `w`: the default one, one worker and one route; under the
/// budgets' load no cap on a connection's requests (`keepalive_requests = 0`), under h2load
/// the default cap (the issue counted it so: the reconnections are part of the count).
fn weir_config(bench: &Bench, w: &Workload, port: u16, load: Load) -> String {
    let keepalive = match load {
        Load::OneAtATime => "keepalive_requests = 0\n",
        Load::H2load(_) => "",
    };
    let tls = if w.tls {
        format!(
            "[listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\n",
            bench.cert.cert_path.display(),
            bench.cert.key_path.display()
        )
    } else {
        String::new()
    };
    let (target, upstream) = match w.route {
        Route::Proxy => (
            "upstream = \"backend\"".to_string(),
            format!(
                "[upstreams.backend]\nservers = [{{ addr = \"{}\" }}]\n",
                bench.backend
            ),
        ),
        Route::Local => (
            "respond = { status = 200, body = \"ok\" }".to_string(),
            String::new(),
        ),
    };
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n\n[admin]\nbind = \"off\"\n\n\
         [[listeners]]\nname = \"budget\"\nbind = \"127.0.0.1:{port}\"\n{keepalive}{}\n{tls}\n\
         [[listeners.routes]]\nname = \"all\"\npath_prefix = \"/\"\n{target}\n{}\n\n{upstream}\n{}\n",
        bench.listener_keys, bench.route_keys, bench.tables
    )
}

/// The commit the tree is at, `+` when it has changes not committed (the commit that will
/// hold them sets the budget).
fn commit_here() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}+")
    } else {
        head
    }
}

fn row(name: &str, budget: Option<&Budget>, measured: f64) -> String {
    match budget {
        None => format!("| {name} | none | {measured:.0} | | |"),
        Some(b) => {
            let change = (measured / b.instructions - 1.0) * 100.0;
            let verdict = if change > TOLERANCE * 100.0 {
                " **over**"
            } else if change < -TOLERANCE * 100.0 {
                " (lower the budget: --update)"
            } else {
                ""
            };
            format!(
                "| {name} | {:.0} | {measured:.0} | {change:+.1} %{verdict} | {} |",
                b.instructions, b.commit
            )
        }
    }
}

/// The functions that cost more per request than in the stored profile, most grown first.
fn grown(reference: &Functions, now: &Functions, top: usize) -> Vec<(String, f64, f64)> {
    let mut rows: Vec<(String, f64, f64)> = now
        .iter()
        .map(|(k, v)| (k.clone(), reference.get(k).copied().unwrap_or(0.0), *v))
        .filter(|(_, before, after)| after - before >= 1.0)
        .collect();
    rows.sort_by(|a, b| (b.2 - b.1).total_cmp(&(a.2 - a.1)));
    rows.truncate(top);
    rows
}

fn print_grown(name: &str, reference: &Functions, now: &Functions) {
    println!("\n{name}: the functions that grew most per request (exclusive instructions)");
    if reference.is_empty() {
        println!("  (no stored profile to compare with)");
        return;
    }
    println!("| budget's profile | now | + | function |\n|---:|---:|---:|---|");
    for (f, before, after) in grown(reference, now, TOP_GROWN) {
        println!(
            "| {before:.1} | {after:.1} | {:+.1} | `{f}` |",
            after - before
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grown_lists_the_largest_growth_first() {
        let before: Functions = [
            ("a".to_string(), 10.0),
            ("b".into(), 10.0),
            ("c".into(), 10.0),
        ]
        .into();
        let now: Functions = [
            ("a".to_string(), 12.0),
            ("b".into(), 40.0),
            ("c".into(), 5.0),
            ("new".into(), 20.0),
        ]
        .into();
        let g = grown(&before, &now, 2);
        assert_eq!(
            g,
            vec![
                ("b".to_string(), 10.0, 40.0),
                ("new".to_string(), 0.0, 20.0)
            ]
        );
    }

    #[test]
    fn rows_flag_over_and_under_budget() {
        let b = Budget {
            instructions: 1000.0,
            commit: "abc".into(),
        };
        assert!(row("w", Some(&b), 1019.0).ends_with("| +1.9 % | abc |"));
        assert!(row("w", Some(&b), 1021.0).contains("**over**"));
        assert!(row("w", Some(&b), 970.0).contains("lower the budget"));
        assert!(row("w", None, 5.0).contains("none"));
    }

    #[test]
    fn the_config_is_the_default_one_route() {
        let ca = weir_testkit::certs::TestCa::new("t");
        let cert = ca.leaf(&["localhost"]);
        let bench = Bench {
            weir: Path::new("weir"),
            backend: "127.0.0.1:9".parse().unwrap(),
            cert: &cert,
            dir: Path::new("."),
            listener_keys: "request_id = false",
            route_keys: "forwarded_headers = false",
            tables: "",
            tls_client: None,
        };
        for w in &WORKLOADS {
            let text = weir_config(&bench, w, 8080, Load::OneAtATime);
            let parsed = weir_config::parse_str(&text, "budget.toml");
            assert!(parsed.is_ok(), "{}: {:?}\n{text}", w.name, parsed.err());
            assert_eq!(text.contains("[listeners.tls]"), w.tls);
        }
        let limited = Bench {
            route_keys: "rate_limit = { rate = \"1/s\", shared = \"r\" }",
            tables: "[cluster.redis.r]\nurl = \"redis://127.0.0.1:1\"",
            ..bench
        };
        let text = weir_config(&limited, &WORKLOADS[1], 8080, Load::H2load(4));
        let parsed = weir_config::parse_str(&text, "budget.toml").expect("tables");
        let route = &parsed.listeners[0].routes[0];
        assert!(route
            .filters
            .rate_limit
            .as_ref()
            .is_some_and(|l| l.shared.is_some()));
    }
}
