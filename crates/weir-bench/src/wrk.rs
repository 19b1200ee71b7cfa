//! `wrk`: its command line, the Lua `done` script that prints exact percentiles (p99.9
//! included), and the parser of its output.

use anyhow::{bail, Result};

use crate::load::LoadOutput;

/// A wrk script whose `done` hook prints one machine-readable line. Latencies are in
/// microseconds, as wrk records them.
pub const REPORT_LUA: &str = r#"-- weir-bench: print exact percentiles and error counts when wrk is done.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WEIR_BENCH requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50=%d p90=%d p99=%d p999=%d max=%d\n",
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"#;

/// The arguments for one wrk run (one thread: the generator has one core).
pub fn args(conns: u32, secs: u64, script: &str, url: &str) -> Vec<String> {
    vec![
        "-t1".into(),
        format!("-c{conns}"),
        format!("-d{secs}s"),
        "--latency".into(),
        "--timeout".into(),
        "10s".into(),
        "-s".into(),
        script.into(),
        url.into(),
    ]
}

/// A duration or latency as wrk prints it (`160.00us`, `0.93ms`, `2.00s`, `1.00m`, `1h`), in
/// microseconds.
pub fn parse_time_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" | "" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    Some(v * scale)
}

fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Parses wrk's output: the human-readable report, then (when present) the `WEIR_BENCH` line
/// of [`REPORT_LUA`], whose exact figures win.
pub fn parse(out: &str) -> Result<LoadOutput> {
    let mut o = LoadOutput::default();
    let mut have_requests = false;
    let mut rps = None;
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            rps = v.trim().parse::<f64>().ok();
        } else if t.contains(" requests in ") {
            // "2136895 requests in 1.00m, 745.87MB read"
            let mut parts = t.split(" requests in ");
            o.requests = parts.next().unwrap_or("").trim().parse().unwrap_or(0);
            let dur = parts.next().unwrap_or("").split(',').next().unwrap_or("");
            o.duration_s = parse_time_us(dur).unwrap_or(0.0) / 1e6;
            have_requests = true;
        } else if t.starts_with("Socket errors:") {
            o.errors = ["connect", "read", "write", "timeout"]
                .iter()
                .filter_map(|k| number_after(t, k))
                .sum();
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            o.non2xx = v.trim().parse().unwrap_or(0);
        } else if let Some((pct, val)) = t.split_once('%') {
            let slot = match pct.trim() {
                "50" => &mut o.p50_us,
                "90" => &mut o.p90_us,
                "99" => &mut o.p99_us,
                _ => continue,
            };
            *slot = parse_time_us(val);
        } else if let Some(kv) = t.strip_prefix("WEIR_BENCH ") {
            apply_report_line(&mut o, kv);
            have_requests = true;
        }
    }
    if !have_requests {
        bail!("no request count in wrk output");
    }
    o.rps = if o.duration_s > 0.0 {
        o.requests as f64 / o.duration_s
    } else {
        rps.unwrap_or(0.0)
    };
    Ok(o)
}

fn apply_report_line(o: &mut LoadOutput, kv: &str) {
    let get = |k: &str| -> Option<u64> {
        kv.split_whitespace()
            .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
    };
    if let Some(v) = get("requests") {
        o.requests = v;
    }
    if let Some(v) = get("duration_us") {
        o.duration_s = v as f64 / 1e6;
    }
    o.errors = ["connect", "read", "write", "timeout"]
        .iter()
        .filter_map(|k| get(k))
        .sum();
    if let Some(v) = get("status") {
        o.non2xx = v;
    }
    let us = |k: &str| get(k).map(|v| v as f64);
    o.p50_us = us("p50").or(o.p50_us);
    o.p90_us = us("p90").or(o.p90_us);
    o.p99_us = us("p99").or(o.p99_us);
    o.p999_us = us("p999");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From seed 001 (wrk 4.x, `--latency`, no script).
    const SEED_001: &str = "Running 1m test @ http://nginx.com
  1 threads and 6 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   180.55us  165.24us   4.34ms   98.44%
    Req/Sec    35.79k     1.94k   38.89k    83.33%
  Latency Distribution
     50%  160.00us
     75%  175.00us
     90%  198.00us
     99%    0.93ms
  2136895 requests in 1.00m, 745.87MB read
Requests/sec:  35613.08
Transfer/sec:     12.43MB
";

    /// From seed 004, with socket errors and non-2xx responses.
    const SEED_004: &str = "Running 15s test @ http://localhost:8100
  4 threads and 512 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    54.19ms   55.63ms 674.53ms   88.55%
    Req/Sec     2.92k     1.40k    5.57k    56.17%
  174748 requests in 15.03s, 140.61MB read
  Socket errors: connect 0, read 660, write 0, timeout 3
  Non-2xx or 3xx responses: 70
Requests/sec:  11624.63
Transfer/sec:      9.35MB
";

    #[test]
    fn parses_time_units() {
        assert_eq!(parse_time_us("160.00us"), Some(160.0));
        assert_eq!(parse_time_us("0.93ms"), Some(930.0));
        assert_eq!(parse_time_us("2.00s"), Some(2e6));
        assert_eq!(parse_time_us("1.00m"), Some(60e6));
        assert_eq!(parse_time_us("abc"), None);
        assert_eq!(parse_time_us("3parsecs"), None);
    }

    #[test]
    fn parses_plain_latency_report() {
        let o = parse(SEED_001).unwrap();
        assert_eq!(o.requests, 2_136_895);
        assert_eq!(o.duration_s, 60.0);
        assert!((o.rps - 35_614.9).abs() < 1.0);
        assert_eq!(o.p50_us, Some(160.0));
        assert_eq!(o.p90_us, Some(198.0));
        assert_eq!(o.p99_us, Some(930.0));
        assert_eq!(o.p999_us, None);
        assert_eq!((o.errors, o.non2xx), (0, 0));
    }

    #[test]
    fn parses_errors_and_non_2xx() {
        let o = parse(SEED_004).unwrap();
        assert_eq!(o.requests, 174_748);
        assert_eq!(o.errors, 663);
        assert_eq!(o.non2xx, 70);
        assert_eq!(o.p50_us, None);
    }

    #[test]
    fn report_line_wins() {
        let out = format!(
            "{SEED_001}WEIR_BENCH requests=2136000 duration_us=60000000 bytes=1 connect=1 \
             read=2 write=0 status=5 timeout=3 p50=161 p90=199 p99=931 p999=2500 max=4340\n"
        );
        let o = parse(&out).unwrap();
        assert_eq!(o.requests, 2_136_000);
        assert!((o.rps - 35_600.0).abs() < 1e-6);
        assert_eq!(o.errors, 6);
        assert_eq!(o.non2xx, 5);
        assert_eq!(o.p50_us, Some(161.0));
        assert_eq!(o.p999_us, Some(2500.0));
    }

    #[test]
    fn rejects_output_without_requests() {
        assert!(parse("unable to connect to 127.0.0.1:1 Connection refused\n").is_err());
    }

    #[test]
    fn script_prints_every_field_the_parser_reads() {
        for k in [
            "requests=",
            "duration_us=",
            "status=",
            "p50=",
            "p999=",
            "timeout=",
        ] {
            assert!(REPORT_LUA.contains(k), "{k}");
        }
        assert!(args(32, 2, "r.lua", "http://x/").contains(&"-c32".to_string()));
    }
}
