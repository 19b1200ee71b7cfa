//! ApacheBench (`ab`): its command line and the parser of its report and of its `-e` CSV
//! percentile file. `ab` opens a new connection per request (no `-k`), as in seeds 002 and
//! 003; it reports no p99.9.

use anyhow::{bail, Result};

use crate::load::LoadOutput;

/// The arguments for one ab run of `secs` seconds. `-t` comes before `-n` so that `-n` (the
/// cap on requests, which sizes ab's sample table) is not reset by `-t`. `-r` keeps going on
/// receive errors (they are counted instead).
pub fn args(conns: u32, secs: u64, post_file: Option<&str>, csv: &str, url: &str) -> Vec<String> {
    let mut a = vec![
        "-q".into(),
        "-r".into(),
        "-s".into(),
        "10".into(),
        "-c".into(),
        conns.to_string(),
        "-t".into(),
        secs.to_string(),
        "-n".into(),
        (secs.max(1) * 100_000).to_string(),
        "-e".into(),
        csv.into(),
    ];
    if let Some(f) = post_file {
        a.extend(["-p".into(), f.into(), "-T".into(), "text/plain".into()]);
    }
    a.push(url.into());
    a
}

fn value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.trim().strip_prefix(key).map(str::trim)
}

fn first_number(s: &str) -> Option<f64> {
    s.split_whitespace().next()?.parse().ok()
}

/// Parses ab's report (stdout).
pub fn parse(out: &str) -> Result<LoadOutput> {
    let mut o = LoadOutput::default();
    let mut complete = None;
    let mut pct_ms = Vec::new();
    for line in out.lines() {
        if let Some(v) = value(line, "Complete requests:") {
            complete = first_number(v).map(|x| x as u64);
        } else if let Some(v) = value(line, "Failed requests:") {
            o.errors += first_number(v).unwrap_or(0.0) as u64;
        } else if let Some(v) = value(line, "Write errors:") {
            o.errors += first_number(v).unwrap_or(0.0) as u64;
        } else if let Some(v) = value(line, "Non-2xx responses:") {
            o.non2xx = first_number(v).unwrap_or(0.0) as u64;
        } else if let Some(v) = value(line, "Time taken for tests:") {
            o.duration_s = first_number(v).unwrap_or(0.0);
        } else if let Some(v) = value(line, "Requests per second:") {
            o.rps = first_number(v).unwrap_or(0.0);
        } else if let Some((p, ms)) = line.trim().split_once('%') {
            // "  50%      4" (whole milliseconds; the CSV has decimals).
            if let (Ok(p), Some(ms)) = (p.trim().parse::<u32>(), first_number(ms)) {
                pct_ms.push((p, ms));
            }
        }
    }
    let Some(complete) = complete else {
        bail!("no 'Complete requests' in ab output");
    };
    o.requests = complete;
    for (p, ms) in pct_ms {
        set_percentile(&mut o, p, ms * 1000.0);
    }
    if o.rps == 0.0 && o.duration_s > 0.0 {
        o.rps = complete as f64 / o.duration_s;
    }
    Ok(o)
}

fn set_percentile(o: &mut LoadOutput, p: u32, us: f64) {
    match p {
        50 => o.p50_us = Some(us),
        90 => o.p90_us = Some(us),
        99 => o.p99_us = Some(us),
        _ => {}
    }
}

/// Applies the `-e` CSV (`Percentage served,Time in ms` then `N,ms` for N in 0..=100), whose
/// fractional milliseconds replace the report's whole ones.
pub fn apply_csv(o: &mut LoadOutput, csv: &str) {
    for line in csv.lines().skip(1) {
        if let Some((p, ms)) = line.split_once(',') {
            if let (Ok(p), Ok(ms)) = (p.trim().parse::<u32>(), ms.trim().parse::<f64>()) {
                set_percentile(o, p, ms * 1000.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From seed 002.
    const SEED_002: &str = "Server Software:
Server Hostname:        localhost
Server Port:            8080

Document Path:          /page.html
Document Length:        76 bytes

Concurrency Level:      10000
Time taken for tests:   10999.996 seconds
Complete requests:      10000000
Failed requests:        12678
   (Connect: 0, Receive: 0, Length: 6339, Exceptions: 6339)
Non-2xx responses:      9993661
Total transferred:      1998732200 bytes
HTML transferred:       759518236 bytes
Requests per second:    909.09 [#/sec] (mean)
Time per request:       10999.996 [ms] (mean)

Percentage of the requests served within a certain time (ms)
  50%  11106
  66%  11183
  90%  11352
  99%  11575
 100%  15559 (longest request)
";

    #[test]
    fn parses_report() {
        let o = parse(SEED_002).unwrap();
        assert_eq!(o.requests, 10_000_000);
        assert_eq!(o.errors, 12_678);
        assert_eq!(o.non2xx, 9_993_661);
        assert_eq!(o.rps, 909.09);
        assert!((o.duration_s - 10_999.996).abs() < 1e-9);
        assert_eq!(o.p50_us, Some(11_106_000.0));
        assert_eq!(o.p99_us, Some(11_575_000.0));
        assert_eq!(o.p999_us, None);
    }

    #[test]
    fn csv_refines_percentiles() {
        let mut o = parse(SEED_002).unwrap();
        apply_csv(
            &mut o,
            "Percentage served,Time in ms\n0,0.120\n50,4.250\n90,5.5\n99,6.125\n",
        );
        assert_eq!(o.p50_us, Some(4250.0));
        assert_eq!(o.p90_us, Some(5500.0));
        assert_eq!(o.p99_us, Some(6125.0));
    }

    #[test]
    fn rejects_aborted_run() {
        assert!(parse("apr_socket_connect(): Connection refused (111)\n").is_err());
    }

    #[test]
    fn t_comes_before_n_and_post_adds_body() {
        let a = args(100, 2, Some("/tmp/b"), "/tmp/c.csv", "http://x/");
        let t = a.iter().position(|x| x == "-t").unwrap();
        let n = a.iter().position(|x| x == "-n").unwrap();
        assert!(t < n);
        assert!(a.contains(&"-p".to_string()));
        assert_eq!(a.last().unwrap(), "http://x/");
    }
}
