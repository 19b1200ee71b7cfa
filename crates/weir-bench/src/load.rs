//! The load side: what one measured run sends (wrk, ab or the open-loop generator), run on
//! the load CPU, and the figures it reports.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::process::{self, Spec};
use crate::{ab, h2load, wrk, LOAD_CPU};

/// What a load generator measured. Latencies in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadOutput {
    pub requests: u64,
    pub duration_s: f64,
    pub rps: f64,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// Connect, read, write and timeout errors (ab: failed requests).
    pub errors: u64,
    /// Responses outside 2xx (wrk: outside 2xx/3xx).
    pub non2xx: u64,
    /// Open-loop only: requests sent more than 1 ms behind schedule, and requests never sent.
    pub late: Option<u64>,
    pub unsent: Option<u64>,
}

/// One load level of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "tool", rename_all = "lowercase")]
pub enum Load {
    /// `wrk -t1 -cN`: closed loop, keep-alive.
    Wrk { conns: u32 },
    /// `ab -cN`: closed loop, a new connection per request; GET or POST (body "hola").
    Ab { conns: u32, post: bool },
    /// The open-loop generator at a fixed rate over `conns` keep-alive connections.
    Rate { rate: u32, conns: u32 },
    /// `h2load -t1 -cN -mM`: HTTP/2 (over https: ALPN h2), `streams` in flight per
    /// connection.
    H2load { conns: u32, streams: u32 },
    /// `h2load -t1 -cN -mM` posting one small gRPC message (`h2load::GRPC_REQUEST`) with
    /// `content-type: application/grpc` and `te: trailers`: unary gRPC calls over h2c.
    GrpcUnary { conns: u32, streams: u32 },
    /// `weir-bench handshakes`: a new TLS connection per request over `conns` connections,
    /// TLS 1.3 or 1.2, the ECDSA or the RSA certificate (by SNI), full or resumed.
    Handshake {
        conns: u32,
        kind: crate::handshakes::Kind,
    },
}

impl Load {
    pub fn label(&self) -> String {
        match self {
            Load::Wrk { conns } => format!("c={conns}"),
            Load::Ab { conns, post } => {
                format!("{} c={conns}", if *post { "POST" } else { "GET" })
            }
            Load::Rate { rate, .. } => format!("{rate} rps"),
            Load::H2load { conns, streams } => format!("h2 c={conns} m={streams}"),
            Load::GrpcUnary { conns, streams } => format!("grpc c={conns} m={streams}"),
            Load::Handshake { conns, kind } => format!("{} c={conns}", kind.label()),
        }
    }

    pub fn conns(&self) -> u32 {
        match *self {
            Load::Wrk { conns }
            | Load::Ab { conns, .. }
            | Load::Rate { conns, .. }
            | Load::H2load { conns, .. }
            | Load::GrpcUnary { conns, .. }
            | Load::Handshake { conns, .. } => conns,
        }
    }

    /// The most requests the load has in flight at once: one per connection, `streams`
    /// per connection for HTTP/2. Each needs an upstream connection of an HTTP/1.1 pool.
    pub fn in_flight(&self) -> u32 {
        match *self {
            Load::H2load { conns, streams } | Load::GrpcUnary { conns, streams } => conns * streams,
            _ => self.conns(),
        }
    }
}

/// The load tools found on this machine, and the run's scratch directory.
pub struct Tools {
    pub wrk: Option<PathBuf>,
    pub ab: Option<PathBuf>,
    pub h2load: Option<PathBuf>,
    pub self_exe: PathBuf,
    pub dir: PathBuf,
}

impl Tools {
    /// Finds wrk and ab and writes the wrk script and the POST body into `dir`.
    pub fn new(dir: PathBuf) -> Result<Tools> {
        std::fs::write(dir.join("report.lua"), wrk::REPORT_LUA)?;
        std::fs::write(dir.join("post-body.txt"), "hola")?;
        std::fs::write(dir.join(h2load::GRPC_FILE), h2load::GRPC_REQUEST)?;
        Ok(Tools {
            wrk: process::find_program("wrk"),
            ab: process::find_program("ab"),
            h2load: process::find_program("h2load"),
            self_exe: std::env::current_exe().context("locate weir-bench itself")?,
            dir,
        })
    }

    /// Why `load` cannot run here, if it cannot.
    pub fn missing(&self, load: &Load) -> Option<&'static str> {
        match load {
            Load::Wrk { .. } if self.wrk.is_none() => Some("wrk is not installed (bench/setup.sh)"),
            Load::Ab { .. } if self.ab.is_none() => {
                Some("ab is not installed (apache2-utils, bench/setup.sh)")
            }
            Load::H2load { .. } | Load::GrpcUnary { .. } if self.h2load.is_none() => {
                Some("h2load is not installed (nghttp2-client, bench/setup.sh)")
            }
            _ if process::fd_limit() < fds_needed(load) => Some(
                "the open-file limit is below 2 per connection + 1024 (raise the hard limit: ulimit -Hn)",
            ),
            _ => None,
        }
    }
}

/// Descriptors each process of a run needs for `load` (the load tool and the proxy inherit
/// the harness's limit): a socket per connection, another for its upstream connection when
/// the proxy forwards, and room for the rest. Seed 002's 10,000 connections need 21,024.
fn fds_needed(load: &Load) -> u64 {
    2 * u64::from(load.in_flight()) + 1024
}

/// Runs `load` against `http://addr{path}` (`https://` with `tls`) for `secs` seconds on
/// the load CPU. Returns what it measured and its own CPU time in seconds.
pub fn run(
    load: &Load,
    tools: &Tools,
    addr: SocketAddr,
    tls: bool,
    path: &str,
    secs: u64,
) -> Result<(LoadOutput, f64)> {
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{addr}{path}");
    let log = tools.dir.join("load.log");
    let csv = tools.dir.join("ab.csv");
    let h2log = tools.dir.join(h2load::LOG_FILE);
    // A log left by the previous run (the warm-up) must not stand in for this one's.
    let _ = std::fs::remove_file(&h2log);
    let spec = match *load {
        Load::Wrk { conns } => {
            let script = tools.dir.join("report.lua");
            Spec::new(
                "wrk",
                tools.wrk.clone().unwrap_or_default(),
                Some(LOAD_CPU),
                log,
            )
            .args(wrk::args(conns, secs, &script.to_string_lossy(), &url))
        }
        Load::Ab { conns, post } => {
            let _ = std::fs::remove_file(&csv);
            let body = tools.dir.join("post-body.txt");
            let body = post.then(|| body.to_string_lossy().into_owned());
            Spec::new(
                "ab",
                tools.ab.clone().unwrap_or_default(),
                Some(LOAD_CPU),
                log,
            )
            .args(ab::args(
                conns,
                secs,
                body.as_deref(),
                &csv.to_string_lossy(),
                &url,
            ))
        }
        Load::H2load { conns, streams } => Spec::new(
            "h2load",
            tools.h2load.clone().unwrap_or_default(),
            Some(LOAD_CPU),
            log,
        )
        .args(h2load::args(conns, streams, secs, &url))
        .args(h2load::log_args(&h2log)),
        Load::GrpcUnary { conns, streams } => Spec::new(
            "h2load",
            tools.h2load.clone().unwrap_or_default(),
            Some(LOAD_CPU),
            log,
        )
        .args(h2load::args(conns, streams, secs, &url))
        .args(h2load::log_args(&h2log))
        .args(h2load::grpc_args(&tools.dir)),
        Load::Handshake { conns, kind } => {
            Spec::new("handshakes", &tools.self_exe, Some(LOAD_CPU), log)
                .args(crate::handshakes::args(addr, path, conns, &kind, secs))
        }
        Load::Rate { rate, conns } => Spec::new("loadgen", &tools.self_exe, Some(LOAD_CPU), log)
            .args([
                "loadgen".to_string(),
                format!("--addr={addr}"),
                format!("--path={path}"),
                format!("--rate={rate}"),
                format!("--conns={conns}"),
                format!("--duration={secs}"),
            ])
            .args(tls.then_some("--tls")),
    };
    let child = process::spawn(&spec.piped())?;
    let log_path = child.log.clone();
    let done = child.finish()?;
    match parse_output(load, &done.stdout, &csv, &h2log) {
        Ok(o) => Ok((o, done.cpu_secs)),
        Err(e) => {
            let err = std::fs::read_to_string(log_path).unwrap_or_default();
            bail!("{e:#} ({}; stderr: {})", done.status, err.trim())
        }
    }
}

/// What the generator of `load` reported: its output, and for ab and h2load the files they
/// write the percentiles to (`csv`, `h2log`).
fn parse_output(load: &Load, stdout: &str, csv: &Path, h2log: &Path) -> Result<LoadOutput> {
    match load {
        Load::Wrk { .. } => wrk::parse(stdout),
        Load::Ab { .. } => ab::parse(stdout).map(|mut o| {
            if let Ok(text) = std::fs::read_to_string(csv) {
                ab::apply_csv(&mut o, &text);
            }
            o
        }),
        Load::Rate { .. } | Load::Handshake { .. } => {
            serde_json::from_str(stdout.trim()).context("generator report")
        }
        Load::H2load { .. } | Load::GrpcUnary { .. } => h2load::parse(stdout).and_then(|mut o| {
            h2load::apply_log(&mut o, h2log)?;
            Ok(o)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(Load::Wrk { conns: 32 }.label(), "c=32");
        assert_eq!(
            Load::Ab {
                conns: 100,
                post: true
            }
            .label(),
            "POST c=100"
        );
        assert_eq!(
            Load::Rate {
                rate: 5000,
                conns: 64
            }
            .label(),
            "5000 rps"
        );
        assert_eq!(
            Load::Rate {
                rate: 5000,
                conns: 64
            }
            .conns(),
            64
        );
    }

    #[test]
    fn h2_loads_count_their_streams_in_flight() {
        let h2 = Load::H2load {
            conns: 32,
            streams: 16,
        };
        assert_eq!((h2.conns(), h2.in_flight()), (32, 512));
        assert_eq!(Load::Wrk { conns: 256 }.in_flight(), 256);
    }

    #[test]
    fn loadgen_report_round_trips() {
        let o = LoadOutput {
            requests: 10,
            late: Some(1),
            p999_us: Some(12.5),
            ..LoadOutput::default()
        };
        let back: LoadOutput = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }
}
