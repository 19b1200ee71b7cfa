//! Summaries of repeated runs: medians and spreads per case, the flags that say how far a
//! case can be trusted, and Weir's ratios to each peer.

use serde::Serialize;

use crate::load::Load;
use crate::peers::Peer;
use crate::runner::Sample;
use crate::stats::{spread, spread_opt, Spread};
use crate::{LOAD_CPU, PROXY_CPU};

/// Medians and spreads over the repetitions of one case.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub rps: Option<Spread>,
    pub cpu_per_req_us: Option<Spread>,
    /// Its user-space part (utime).
    pub user_per_req_us: Option<Spread>,
    pub p50_us: Option<Spread>,
    pub p90_us: Option<Spread>,
    pub p99_us: Option<Spread>,
    pub p999_us: Option<Spread>,
    pub errors: u64,
    pub non2xx: u64,
    pub peak_rss_mib: Option<Spread>,
    pub proxy_cpu_pct: Option<Spread>,
    pub gen_cpu_pct: Option<Spread>,
    pub backend_cpu_pct: Option<Spread>,
    pub cpu0_other_pct: Option<Spread>,
    pub sleeps_per_req: Option<Spread>,
    /// The most requests and late sends (open loop) of any repetition.
    pub requests: u64,
    pub late: u64,
}

/// One peer under one load.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    pub peer: Peer,
    pub peer_name: &'static str,
    pub load: Load,
    pub label: String,
    pub samples: Vec<Sample>,
    pub summary: Summary,
    pub flags: Vec<String>,
}

/// Weir's medians divided by a peer's.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// The Weir variant measured (`weir`, `weir-tcp`, `weir-observed`).
    pub weir: &'static str,
    pub peer: &'static str,
    pub load: String,
    pub cpu_per_req: Option<f64>,
    /// The CPU/req ratio of each repetition (the two runs seconds apart): less exposed to
    /// the machine's drift than the ratio of medians.
    pub cpu_per_req_paired: Option<Spread>,
    pub rps: Option<f64>,
    pub p99: Option<f64>,
    /// The p99 ratio of each repetition: a closed-loop p99 follows the machine's load from
    /// second to second, so the ratio of medians of runs minutes apart says little.
    pub p99_paired: Option<Spread>,
}

/// Compares the requests Weir's `/metrics` counted during a run with those the load tool
/// completed: the proxy may also have seen up to `conns` requests the tool abandoned when
/// its time ran out.
pub fn metrics_verdict(counted: f64, completed: u64, conns: u32) -> String {
    let extra = counted - completed as f64;
    let verdict = if (0.0..=f64::from(conns)).contains(&extra) {
        "ok"
    } else {
        "MISMATCH"
    };
    format!(
        "/metrics counted {counted:.0} requests, the load tool completed {completed}: {verdict}"
    )
}

/// Medians and spreads of a case's samples.
pub fn summarise(s: &[Sample]) -> Summary {
    let f = |g: fn(&Sample) -> Option<f64>| spread_opt(&s.iter().map(g).collect::<Vec<_>>());
    Summary {
        rps: spread(&s.iter().map(|x| x.load.rps).collect::<Vec<_>>()),
        cpu_per_req_us: f(|x| x.cpu_per_req_us),
        user_per_req_us: f(|x| x.user_per_req_us),
        p50_us: f(|x| x.load.p50_us),
        p90_us: f(|x| x.load.p90_us),
        p99_us: f(|x| x.load.p99_us),
        p999_us: f(|x| x.load.p999_us),
        errors: s.iter().map(|x| x.load.errors).max().unwrap_or(0),
        non2xx: s.iter().map(|x| x.load.non2xx).max().unwrap_or(0),
        peak_rss_mib: f(|x| x.peak_rss_mib),
        proxy_cpu_pct: f(|x| Some(x.proxy_cpu_pct)),
        gen_cpu_pct: f(|x| Some(x.gen_cpu_pct)),
        backend_cpu_pct: f(|x| x.backend_cpu_pct),
        cpu0_other_pct: f(|x| x.cpu0_other_pct),
        sleeps_per_req: f(|x| x.sleeps_per_req),
        requests: s.iter().map(|x| x.load.requests).max().unwrap_or(0),
        late: s.iter().filter_map(|x| x.load.late).max().unwrap_or(0),
    }
}

/// Warnings about how far a case can be trusted.
pub fn flags(peer: Peer, s: &Summary, expect: u16) -> Vec<String> {
    let mut f = Vec::new();
    let med = |x: &Option<Spread>| x.map_or(0.0, |s| s.median);
    let gen = med(&s.gen_cpu_pct);
    let be = med(&s.backend_cpu_pct);
    // Generator and backend share the load CPU; for `direct` the backend is on the proxy CPU.
    let cpu1 = if peer == Peer::Direct { gen } else { gen + be };
    if gen > 90.0 || be > 90.0 || cpu1 > 90.0 {
        if med(&s.proxy_cpu_pct) > 90.0 {
            // Both cores full: req/s is capped by the load side too; CPU/req still compares.
            f.push(format!(
                "both CPUs saturated (CPU{LOAD_CPU} {cpu1:.0}%): compare CPU/req"
            ));
        } else {
            f.push(format!(
                "generator/backend-bound (CPU{LOAD_CPU} {cpu1:.0}%)"
            ));
        }
    }
    let other = med(&s.cpu0_other_pct);
    if other > 10.0 {
        f.push(format!("CPU{PROXY_CPU} shared ({other:.0}% other load)"));
    }
    if s.errors > 0 {
        f.push(format!("{} errors", s.errors));
    }
    if expect / 100 == 2 && s.non2xx > 0 {
        f.push(format!("{} non-2xx", s.non2xx));
    }
    if let Some(r) = s.rps.filter(|r| r.n > 1 && r.relative() > 0.10) {
        f.push(format!("req/s spread {:.0}%", r.relative() * 100.0));
    }
    if s.late > 0 && s.late * 100 > s.requests {
        f.push(format!("behind schedule ({} late sends)", s.late));
    }
    f
}

/// An open-loop row whose median req/s fell short of its target rate by over 2 %: the
/// peer (or the generator) did not hold the rate, and its CPU/req is not at the same load.
pub fn rate_flag(load: &Load, s: &Summary) -> Option<String> {
    let Load::Rate { rate, .. } = *load else {
        return None;
    };
    let got = s.rps?.median;
    (got < f64::from(rate) * 0.98).then(|| format!("rate not held ({got:.0} of {rate} req/s)"))
}

/// Weir's medians over each other peer's, load by load: `weir` against every non-Weir
/// peer, and the like-for-like pairs: `weir-tcp` against `haproxy-tcp` (both L4) and
/// `weir-observed` against `weir` (the cost of the access log and admin listener).
pub fn ratios(cases: &[Case]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for w in cases.iter().filter(|c| c.peer == Peer::Weir) {
        for c in cases
            .iter()
            .filter(|c| c.label == w.label && !c.peer.is_weir() && c.peer != Peer::Direct)
        {
            out.push(ratio(w, c));
        }
    }
    let pairs = [
        (Peer::WeirTcp, Peer::HaproxyTcp),
        (Peer::WeirObserved, Peer::Weir),
    ];
    for (num, den) in pairs {
        for w in cases.iter().filter(|c| c.peer == num) {
            if let Some(c) = cases.iter().find(|c| c.peer == den && c.label == w.label) {
                out.push(ratio(w, c));
            }
        }
    }
    out
}

fn ratio(w: &Case, c: &Case) -> Ratio {
    let div = |a: Option<Spread>, b: Option<Spread>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
        _ => None,
    };
    Ratio {
        weir: w.peer_name,
        peer: c.peer_name,
        load: c.label.clone(),
        cpu_per_req: div(w.summary.cpu_per_req_us, c.summary.cpu_per_req_us),
        cpu_per_req_paired: paired_ratio(&w.samples, &c.samples, |s| s.cpu_per_req_us),
        rps: div(w.summary.rps, c.summary.rps),
        p99: div(w.summary.p99_us, c.summary.p99_us),
        p99_paired: paired_ratio(&w.samples, &c.samples, |s| s.load.p99_us),
    }
}

/// The spread of `w`'s figure `f` (CPU/req, p99) over `c`'s, repetition by repetition.
fn paired_ratio(w: &[Sample], c: &[Sample], f: impl Fn(&Sample) -> Option<f64>) -> Option<Spread> {
    let per_rep: Vec<f64> = w
        .iter()
        .filter_map(|a| {
            let b = c.iter().find(|b| b.repetition == a.repetition)?;
            Some(f(a)? / f(b).filter(|v| *v > 0.0)?)
        })
        .collect();
    spread(&per_rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::LoadOutput;

    fn sample(rps: f64, cpu: f64, gen: f64, be: f64) -> Sample {
        Sample {
            repetition: 0,
            load: LoadOutput {
                rps,
                requests: 1000,
                p99_us: Some(100.0),
                ..LoadOutput::default()
            },
            cpu_per_req_us: Some(cpu),
            user_per_req_us: Some(cpu / 4.0),
            proxy_cpu_pct: 99.0,
            peak_rss_mib: Some(5.0),
            gen_cpu_pct: gen,
            backend_cpu_pct: Some(be),
            cpu0_other_pct: Some(1.0),
            metrics: None,
            sleeps_per_req: None,
        }
    }

    fn case(peer: Peer, s: Vec<Sample>) -> Case {
        let summary = summarise(&s);
        Case {
            peer,
            peer_name: peer.name(),
            load: Load::Wrk { conns: 32 },
            label: "c=32".into(),
            samples: s,
            summary,
            flags: Vec::new(),
        }
    }

    #[test]
    fn metrics_counts_allow_in_flight_requests() {
        assert!(metrics_verdict(1050.0, 1000, 100).ends_with(": ok"));
        assert!(metrics_verdict(1000.0, 1000, 100).ends_with(": ok"));
        assert!(metrics_verdict(990.0, 1000, 100).ends_with("MISMATCH"));
        assert!(metrics_verdict(1101.0, 1000, 100).ends_with("MISMATCH"));
    }

    #[test]
    fn summary_takes_medians() {
        let s = summarise(&[
            sample(100.0, 20.0, 10.0, 10.0),
            sample(300.0, 10.0, 10.0, 10.0),
            sample(200.0, 30.0, 10.0, 10.0),
        ]);
        let rps = s.rps.unwrap();
        assert_eq!((rps.median, rps.min, rps.max), (200.0, 100.0, 300.0));
        assert_eq!(s.cpu_per_req_us.unwrap().median, 20.0);
    }

    #[test]
    fn flags_load_bound_and_spread() {
        let s = summarise(&[
            sample(100.0, 20.0, 60.0, 35.0),
            sample(130.0, 20.0, 60.0, 35.0),
        ]);
        let f = flags(Peer::Weir, &s, 200);
        assert!(f.iter().any(|x| x.contains("both CPUs saturated")), "{f:?}");
        assert!(f.iter().any(|x| x.contains("spread")), "{f:?}");
        // For `direct` the backend is not on the load CPU.
        let f = flags(Peer::Direct, &s, 200);
        assert!(!f.iter().any(|x| x.contains("bound")), "{f:?}");
    }

    #[test]
    fn a_fixed_rate_row_below_its_target_is_flagged() {
        let rate = Load::Rate {
            rate: 10_000,
            conns: 32,
        };
        let held = summarise(&[sample(9_990.0, 10.0, 1.0, 1.0)]);
        assert_eq!(rate_flag(&rate, &held), None);
        let short = summarise(&[sample(9_000.0, 10.0, 1.0, 1.0)]);
        assert_eq!(
            rate_flag(&rate, &short).as_deref(),
            Some("rate not held (9000 of 10000 req/s)")
        );
        // Closed-loop rows have no target.
        assert_eq!(rate_flag(&Load::Wrk { conns: 32 }, &short), None);
    }

    #[test]
    fn ratios_pair_the_l4_listener_with_haproxy_tcp_and_observed_with_plain() {
        let cases = vec![
            case(Peer::Weir, vec![sample(200.0, 10.0, 1.0, 1.0)]),
            case(Peer::WeirObserved, vec![sample(190.0, 11.0, 1.0, 1.0)]),
            case(Peer::WeirTcp, vec![sample(200.0, 8.0, 1.0, 1.0)]),
            case(Peer::HaproxyTcp, vec![sample(200.0, 10.0, 1.0, 1.0)]),
        ];
        let r = ratios(&cases);
        let find = |w: &str, p: &str| r.iter().find(|x| x.weir == w && x.peer == p);
        assert_eq!(find("weir", "haproxy-tcp").unwrap().cpu_per_req, Some(1.0));
        assert_eq!(
            find("weir-tcp", "haproxy-tcp").unwrap().cpu_per_req,
            Some(0.8)
        );
        let observed = find("weir-observed", "weir").unwrap().cpu_per_req.unwrap();
        assert!((observed - 1.1).abs() < 1e-9, "{observed}");
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn paired_ratios_divide_runs_of_the_same_repetition() {
        let rep = |r: u32, cpu: f64| Sample {
            repetition: r,
            ..sample(100.0, cpu, 1.0, 1.0)
        };
        // Repetition 1 of the peer failed: only repetitions 0 and 2 pair up.
        let w = case(Peer::Weir, vec![rep(0, 10.0), rep(1, 30.0), rep(2, 12.0)]);
        let c = case(Peer::Nginx, vec![rep(0, 20.0), rep(2, 10.0)]);
        let r = ratios(&[w, c]);
        let paired = r[0].cpu_per_req_paired.unwrap();
        assert_eq!((paired.min, paired.max, paired.n), (0.5, 1.2, 2));
        assert!((paired.median - 0.85).abs() < 1e-9);
    }

    #[test]
    fn p99_ratios_pair_repetitions_too() {
        let rep = |r: u32, p99: Option<f64>| {
            let mut s = Sample {
                repetition: r,
                ..sample(100.0, 10.0, 1.0, 1.0)
            };
            s.load.p99_us = p99;
            s
        };
        // Medians 100 / 100 would say 1.00x; repetition by repetition Weir is at 0.5x-2x.
        let w = case(
            Peer::Weir,
            vec![rep(0, Some(50.0)), rep(1, Some(100.0)), rep(2, Some(400.0))],
        );
        let c = case(
            Peer::Nginx,
            vec![rep(0, Some(100.0)), rep(1, Some(200.0)), rep(2, None)],
        );
        let r = ratios(&[w, c]);
        let paired = r[0].p99_paired.unwrap();
        assert_eq!(
            (paired.median, paired.min, paired.max, paired.n),
            (0.5, 0.5, 0.5, 2)
        );
        assert_eq!(r[0].p99, Some(100.0 / 150.0));
    }

    #[test]
    fn ratios_compare_weir_with_each_peer() {
        let cases = vec![
            case(Peer::Weir, vec![sample(200.0, 10.0, 1.0, 1.0)]),
            case(Peer::Nginx, vec![sample(100.0, 20.0, 1.0, 1.0)]),
            case(Peer::Direct, vec![sample(300.0, 5.0, 1.0, 1.0)]),
        ];
        let r = ratios(&cases);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].weir, "weir");
        assert_eq!(r[0].peer, "nginx");
        assert_eq!(r[0].cpu_per_req, Some(0.5));
        assert_eq!(r[0].rps, Some(2.0));
        assert_eq!(r[0].p99, Some(1.0));
    }
}
