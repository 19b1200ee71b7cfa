//! `h2load` (nghttp2's HTTP/2 load generator): its command line and the parser of its
//! summary. Over https it negotiates h2 through ALPN; `-m` streams per connection are kept
//! in flight. It prints no percentiles, only min / max / mean per request, so the latency
//! columns stay empty for its rows.

use anyhow::{bail, Context, Result};

use crate::load::LoadOutput;

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
}
