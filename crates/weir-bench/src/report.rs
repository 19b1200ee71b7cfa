//! Output: the markdown report (stdout and `results.md`), `results.json`, and one SVG chart
//! per scenario, all under `--out`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::envinfo::Env;
use crate::load::Load;
use crate::runner::{Opts, ScenarioResult};
use crate::stats::Spread;
use crate::{chart, LOAD_CPU, PROXY_CPU};

/// Everything a run produced.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub env: &'a Env,
    pub options: &'a Opts,
    pub scenarios: &'a [ScenarioResult],
}

/// A latency in microseconds, in a readable unit.
pub fn fmt_us(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// `median (min–max)` when the repetitions differ, else the value alone.
pub fn fmt_spread(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    match s {
        None => "n/a".into(),
        Some(s) if s.n > 1 && s.min != s.max => {
            format!("{} ({}–{})", f(s.median), f(s.min), f(s.max))
        }
        Some(s) => f(s.median),
    }
}

fn med(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    s.map_or("n/a".into(), |s| f(s.median))
}

fn pct(v: f64) -> String {
    format!("{v:.0}%")
}

/// The markdown report.
pub fn markdown(r: &Report) -> String {
    let e = r.env;
    let mut m = String::new();
    let _ = writeln!(m, "# Weir benchmark, {}\n", e.date_utc);
    let _ = writeln!(
        m,
        "- Machine: {} ({} cores), kernel {}, {}\n- Weir commit: {}",
        e.cpu_model, e.cores, e.kernel, e.os, e.weir_commit
    );
    for (tool, v) in &e.versions {
        let _ = writeln!(m, "- {tool}: {v}");
    }
    let o = r.options;
    let _ = writeln!(
        m,
        "- Proxy on CPU {PROXY_CPU}, load generator and backends on CPU {LOAD_CPU}; {} repetition(s) of {} s after a {} s warm-up{}; \
         figures are the median (min–max) of the repetitions.\n",
        o.repeat,
        o.secs,
        o.warmup,
        if o.quick { " (--quick: a smoke test, not a result)" } else { "" }
    );
    for s in r.scenarios {
        scenario_md(&mut m, s);
    }
    m
}

fn scenario_md(m: &mut String, s: &ScenarioResult) {
    let sc = &s.scenario;
    let _ = writeln!(m, "## {}: reproduces seed {}\n", sc.name, sc.seeds);
    let _ = writeln!(
        m,
        "{} Backend: {}. Path `{}`; a correct answer is {}. ({:.0} s)\n",
        sc.about, s.backend, sc.path, sc.expect_status, s.seconds
    );
    if !s.cases.is_empty() {
        m.push_str("| proxy | load | req/s | CPU/req (us) | p50 | p90 | p99 | p99.9 | errors | non-2xx | peak RSS (MiB) | proxy CPU | generator CPU | backend CPU | flags |\n");
        m.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    }
    for c in &s.cases {
        let x = &c.summary;
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.peer_name,
            c.label,
            fmt_spread(x.rps, |v| format!("{v:.0}")),
            fmt_spread(x.cpu_per_req_us, |v| format!("{v:.1}")),
            med(x.p50_us, fmt_us),
            med(x.p90_us, fmt_us),
            med(x.p99_us, fmt_us),
            med(x.p999_us, fmt_us),
            x.errors,
            x.non2xx,
            med(x.peak_rss_mib, |v| format!("{v:.1}")),
            med(x.proxy_cpu_pct, pct),
            med(x.gen_cpu_pct, pct),
            med(x.backend_cpu_pct, pct),
            c.flags.join("; "),
        );
    }
    if let Some(note) = h2load_latency_note(&sc.loads) {
        let _ = writeln!(m, "\n{note}");
    }
    sleeps_md(m, s);
    cpu_split_md(m, s);
    if !s.ratios.is_empty() {
        m.push_str("\nWeir ÷ peer (medians): CPU/req below 1 and req/s above 1 favour Weir. `weir-tcp` is compared with `haproxy-tcp` (both L4), and `weir-observed` with `weir` (the cost of the access log and admin listener). \"Paired\" (CPU/req, p99) divides the two runs of each repetition (seconds apart) and gives the median (min–max) of those ratios: the figure least exposed to the machine's drift.\n\n");
        m.push_str(
            "| weir | peer | load | CPU/req ratio | CPU/req, paired | req/s ratio | p99 ratio | p99, paired |\n|---|---|---|---:|---:|---:|---:|---:|\n",
        );
        let r2 = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}x"));
        for r in &s.ratios {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.weir,
                r.peer,
                r.load,
                r2(r.cpu_per_req),
                fmt_spread(r.cpu_per_req_paired, |v| format!("{v:.2}x")),
                r2(r.rps),
                r2(r.p99),
                fmt_spread(r.p99_paired, |v| format!("{v:.2}x")),
            );
        }
    }
    let metrics: Vec<String> = s
        .cases
        .iter()
        .flat_map(|c| {
            c.samples.iter().filter_map(move |x| {
                x.metrics
                    .as_ref()
                    .map(|t| format!("{} {}: {t}", c.peer_name, c.label))
            })
        })
        .collect();
    if !s.notes.is_empty() || !metrics.is_empty() {
        m.push('\n');
    }
    for n in s.notes.iter().chain(metrics.iter().map(|t| t as &String)) {
        let _ = writeln!(m, "- {n}");
    }
    m.push('\n');
}

/// For open-loop (fixed-rate) rows, where every proxy serves the same load: how often each
/// proxy blocked per request. A proxy that is not saturated sleeps between requests, and
/// each sleep and wake-up costs CPU that a saturated one does not pay.
fn sleeps_md(m: &mut String, s: &ScenarioResult) {
    let rows: Vec<_> = s
        .cases
        .iter()
        .filter(|c| matches!(c.load, crate::load::Load::Rate { .. }))
        .filter_map(|c| Some((c, c.summary.sleeps_per_req?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    m.push_str("\nProxy sleeps per request (voluntary context switches of all its threads):\n\n| proxy | load | sleeps/req |\n|---|---|---:|\n");
    for (c, v) in rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} |",
            c.peer_name,
            c.label,
            fmt_spread(Some(v), |v| format!("{v:.3}"))
        );
    }
}

/// Where each case's CPU per request went: user space (the proxy's own code) and the
/// kernel (mostly its sockets' TCP work, which only fewer system calls lower). Two peers'
/// user-space figures say how far apart their code is; their kernel figures, how far
/// apart their system calls are.
fn cpu_split_md(m: &mut String, s: &ScenarioResult) {
    let rows: Vec<_> = s
        .cases
        .iter()
        .filter_map(|c| {
            let cpu = c.summary.cpu_per_req_us?.median;
            let user = c.summary.user_per_req_us?.median;
            Some((c, user, cpu))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    m.push_str(
        "\nCPU per request by where it ran (medians; utime and stime from `/proc`, in clock \
         ticks):\n\n| proxy | load | user (us) | kernel (us) | kernel share |\n\
         |---|---|---:|---:|---:|\n",
    );
    for (c, user, cpu) in rows {
        let kernel = (cpu - user).max(0.0);
        let share = if cpu > 0.0 { kernel / cpu * 100.0 } else { 0.0 };
        let _ = writeln!(
            m,
            "| {} | {} | {user:.1} | {kernel:.1} | {share:.0} % |",
            c.peer_name, c.label
        );
    }
}

/// What the latencies of h2load rows are, when the scenario has some: they are easily read
/// as the open-loop figures of the `latency` scenario, which they are not.
fn h2load_latency_note(loads: &[Load]) -> Option<&'static str> {
    loads
        .iter()
        .any(|l| matches!(l, Load::H2load { .. } | Load::GrpcUnary { .. }))
        .then_some(
            "h2 rows: p50–p99.9 come from h2load's `--log-file` (each request from its start to \
             the end of its response). h2load is closed-loop (a new request only when one \
             ends), so these latencies are not corrected for coordinated omission, unlike the \
             open-loop figures of the `latency` scenario.",
        )
}

/// Writes `results.md`, `results.json` and `<scenario>.svg` into `dir`.
pub fn write_all(dir: &Path, r: &Report, md: &str) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    let p = dir.join("results.md");
    std::fs::write(&p, md)?;
    written.push(p.display().to_string());
    let p = dir.join("results.json");
    std::fs::write(&p, serde_json::to_string_pretty(r)?)?;
    written.push(p.display().to_string());
    for s in r.scenarios {
        let p = dir.join(format!("{}.svg", s.scenario.name));
        chart::write_svg(&p, s).with_context(|| format!("chart {}", p.display()))?;
        written.push(p.display().to_string());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::spread;

    #[test]
    fn h2load_rows_say_their_latencies_are_closed_loop() {
        let h2 = Load::H2load {
            conns: 32,
            streams: 16,
        };
        let note = h2load_latency_note(&[Load::Wrk { conns: 32 }, h2]).unwrap();
        assert!(note.contains("coordinated omission"));
        assert!(h2load_latency_note(&[Load::Wrk { conns: 32 }]).is_none());
    }

    #[test]
    fn formats_latencies() {
        assert_eq!(fmt_us(160.0), "160us");
        assert_eq!(fmt_us(1_234.0), "1.23ms");
        assert_eq!(fmt_us(2_500_000.0), "2.50s");
    }

    #[test]
    fn formats_spreads() {
        let f = |v: f64| format!("{v:.0}");
        assert_eq!(fmt_spread(spread(&[1.0, 3.0, 2.0]), f), "2 (1–3)");
        assert_eq!(fmt_spread(spread(&[2.0]), f), "2");
        assert_eq!(fmt_spread(None, f), "n/a");
    }
}
