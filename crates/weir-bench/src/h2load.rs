//! `h2load` (nghttp2's HTTP/2 load generator): its command line, the parser of its
//! summary and of its per-request log. Over https it negotiates h2 through ALPN; `-m`
//! streams per connection are kept in flight. Its summary has no percentiles (only min /
//! max / mean per request), so they come from the `--log-file` it writes: one line per
//! request with its duration. h2load is closed-loop: these latencies are not corrected for
//! coordinated omission (the `latency` scenario's open-loop generator is).

use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::load::LoadOutput;
use crate::stats::percentile_sorted;

/// The arguments for one h2load run: one thread, `conns` connections, `streams` concurrent
/// streams each, for `secs` seconds.
pub fn args(conns: u32, streams: u32, secs: u64, url: &str) -> Vec<String> {
    vec![
        "-t1".into(),
        format!("-c{conns}"),
        format!("-m{streams}"),
        format!("-D{secs}"),
        url.into(),
    ]
}

/// The gRPC scenario's request: one length-prefixed message (flag 0, 4-byte length) of a
/// 16-byte payload, as a small unary call carries.
pub const GRPC_REQUEST: &[u8] = b"\x00\x00\x00\x00\x10\x0a\x0eweir-bench-rpc";
/// Its file in the run's directory (h2load's `-d`).
pub const GRPC_FILE: &str = "grpc-request.bin";
/// The method path the gRPC scenario calls.
pub const GRPC_PATH: &str = "/bench.Echo/Unary";

/// What makes h2load's POSTs gRPC calls: the message as the body, and the gRPC fields.
pub fn grpc_args(dir: &std::path::Path) -> Vec<String> {
    vec![
        "-d".into(),
        dir.join(GRPC_FILE).to_string_lossy().into_owned(),
        "-H".into(),
        "content-type: application/grpc".into(),
        "-H".into(),
        "te: trailers".into(),
    ]
}

/// h2load's per-request log, in the run's directory (rewritten by every run).
pub const LOG_FILE: &str = "h2load-requests.tsv";

/// Makes h2load write its per-request log to `path`.
pub fn log_args(path: &Path) -> Vec<String> {
    vec![format!("--log-file={}", path.display())]
}

/// The durations (microseconds) of the requests h2load's `--log-file` lists as answered.
/// Its lines are tab-separated: start time (us since the epoch), status (-1 for a failed
/// stream), duration until the end of the response (us), maybe more columns later. Read
/// line by line into one reused buffer (a 4 s run logs a few hundred thousand lines); failed
/// streams are left out and so are lines that do not parse. A last line without its newline
/// was cut short (its duration may have lost digits) and is left out too.
pub fn log_durations(mut log: impl BufRead) -> std::io::Result<Vec<u32>> {
    let mut durations = Vec::new();
    let mut line = String::new();
    while log.read_line(&mut line)? != 0 {
        if !line.ends_with('\n') {
            break;
        }
        let mut cols = line.trim_end().split('\t').skip(1);
        let status = cols.next().and_then(|s| s.parse::<i32>().ok());
        let us = cols.next().and_then(|s| s.parse::<u32>().ok());
        if let (Some(status), Some(us)) = (status, us) {
            if status >= 0 {
                durations.push(us);
            }
        }
        line.clear();
    }
    Ok(durations)
}

/// Fills the percentiles of `o` from the durations of its requests (nearest rank, like the
/// open-loop generator's); leaves them empty when no request was answered.
pub fn apply_durations(o: &mut LoadOutput, mut durations: Vec<u32>) {
    durations.sort_unstable();
    let at = |p: f64| percentile_sorted(&durations, p).map(f64::from);
    o.p50_us = at(50.0);
    o.p90_us = at(90.0);
    o.p99_us = at(99.0);
    o.p999_us = at(99.9);
}

/// Reads the log h2load wrote to `path` into the percentiles of `o`.
pub fn apply_log(o: &mut LoadOutput, path: &Path) -> Result<()> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("h2load's request log {}", path.display()))?;
    let durations = log_durations(std::io::BufReader::new(file))
        .with_context(|| format!("read h2load's request log {}", path.display()))?;
    apply_durations(o, durations);
    Ok(())
}

/// A few requests (`-n`) on one connection, to check a peer answers before measuring.
pub fn check_args(requests: u32, url: &str) -> Vec<String> {
    vec!["-c1".into(), format!("-n{requests}"), url.into()]
}

/// The figures of h2load's summary (`finished in`, `requests:`, `status codes:`).
pub fn parse(out: &str) -> Result<LoadOutput> {
    let line = |prefix: &str| {
        out.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .with_context(|| format!("no '{prefix}' line in h2load's output"))
    };
    let finished = line("finished in ")?;
    let duration_s = finished["finished in ".len()..]
        .split(',')
        .next()
        .and_then(crate::wrk::parse_time_us)
        .map(|us| us / 1e6)
        .context("h2load duration")?;
    let counts = |l: &str| -> Vec<(String, u64)> {
        l.split(':')
            .nth(1)
            .unwrap_or_default()
            .split(',')
            .filter_map(|part| {
                let mut words = part.split_whitespace();
                let n = words.next()?.parse().ok()?;
                Some((words.next()?.to_string(), n))
            })
            .collect()
    };
    let requests = counts(line("requests:")?);
    let status = counts(line("status codes:")?);
    let get = |list: &[(String, u64)], key: &str| {
        list.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n)
    };
    let done = get(&requests, "succeeded");
    if duration_s <= 0.0 {
        bail!("h2load ran for {duration_s} s");
    }
    Ok(LoadOutput {
        requests: done,
        duration_s,
        rps: done as f64 / duration_s,
        errors: get(&requests, "failed") + get(&requests, "errored") + get(&requests, "timeout"),
        non2xx: get(&status, "3xx") + get(&status, "4xx") + get(&status, "5xx"),
        ..LoadOutput::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "starting benchmark...
spawning thread #0: 32 total client(s). Timing-based test with 0s of warm-up time and 10s of main duration for measurements.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_256_GCM_SHA384
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 10.00s, 41234.50 req/s, 29.87MB/s
requests: 412345 total, 412857 started, 412345 done, 412340 succeeded, 5 failed, 0 errored, 0 timeout
status codes: 412340 2xx, 0 3xx, 2 4xx, 0 5xx
traffic: 298.70MB (313210340) total, 4.34MB (4550123) headers (space savings 94.12%), 253.59MB (265907120) data
                     min         max         mean         sd        +/- sd
time for request:      291us     31.40ms     12.38ms      2.10ms    70.21%
";

    #[test]
    fn parses_the_summary() {
        let o = parse(SAMPLE).unwrap();
        assert_eq!(o.requests, 412_340);
        assert!((o.duration_s - 10.0).abs() < 1e-9);
        assert!((o.rps - 41_234.0).abs() < 1.0);
        assert_eq!(o.errors, 5);
        assert_eq!(o.non2xx, 2);
        assert_eq!(o.p99_us, None);
    }

    #[test]
    fn a_truncated_report_is_an_error() {
        assert!(parse("starting benchmark...\n").is_err());
        assert!(args(32, 16, 5, "https://x/").contains(&"-m16".to_string()));
        assert_eq!(GRPC_REQUEST.len(), 5 + 16);
        assert_eq!(GRPC_REQUEST[4] as usize, GRPC_REQUEST.len() - 5);
    }

    /// As h2load 1.52 writes it (`-D` ends with the streams in flight failed: status -1),
    /// plus a column more, a line that is no request and a last line cut short.
    const LOG: &str = "1795500311743033\t200\t303
1795500311743034\t200\t339
1795500311742999\t503\t385
1795500311743000\t-1\t9000000
1795500311743403\t200\t72\textra
not a request line
1795500311743500\t200\t12";

    #[test]
    fn the_log_gives_the_durations_of_answered_requests() {
        let d = log_durations(LOG.as_bytes()).unwrap();
        assert_eq!(d, vec![303, 339, 385, 72]);
        // The same durations whatever the reader's buffer size (a line split across reads).
        for cap in 1..LOG.len() {
            let r = std::io::BufReader::with_capacity(cap, LOG.as_bytes());
            assert_eq!(log_durations(r).unwrap(), d, "buffer of {cap} bytes");
        }
        assert!(log_durations("".as_bytes()).unwrap().is_empty());
    }

    #[test]
    fn durations_fill_the_percentiles() {
        let mut o = parse(SAMPLE).unwrap();
        apply_durations(&mut o, (1..=1000).rev().collect());
        assert_eq!(
            (o.p50_us, o.p90_us, o.p99_us, o.p999_us),
            (Some(500.0), Some(900.0), Some(990.0), Some(999.0))
        );
        let mut none = LoadOutput::default();
        apply_durations(&mut none, Vec::new());
        assert_eq!(none.p99_us, None);
    }

    #[test]
    fn a_missing_log_is_an_error() {
        let mut o = LoadOutput::default();
        let err = apply_log(&mut o, Path::new("/nonexistent/h2load.tsv")).unwrap_err();
        assert!(format!("{err:#}").contains("request log"));
    }
}
