//! `weir-bench loadgen`: an open-loop HTTP/1.1 generator at a fixed request rate, with
//! latency measured from each request's *intended* send time (coordinated-omission corrected,
//! as wrk2 does). wrk2 is not packaged by Debian, hence this.
//!
//! The rate is split evenly over `conns` keep-alive connections; connection `i` owes request
//! `k` at `start + (i + k * conns) / rate`. When a response is late, the next request goes
//! out at once and its latency still counts from when it was due, so a stall shows up in
//! the percentiles instead of silently lowering the rate. Send times are kept with a timerfd
//! per connection (tokio's own timer has 1 ms granularity). One current-thread runtime: it
//! runs pinned to the load CPU. It prints one JSON [`LoadOutput`] line on stdout.
//!
//! With `--tls` every connection is a TLS 1.3 session of its own (rustls, the client setup of
//! [`crate::handshakes`], ALPN `http/1.1`), opened before the clock starts and kept alive:
//! the rows measure record encryption and the HTTP work at a fixed rate, not handshakes. The
//! connection loop is generic over the stream ([`Dial`], in [`crate::http1_client`]), so the
//! plain path is the same code it was, with no TLS branch per request.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::handshakes::Profile;
use crate::http1_client::{exchange, request, Dial, Plain, Tls};
use crate::load::LoadOutput;
use crate::stats::percentile_sorted;

/// Arguments of the hidden `loadgen` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long)]
    pub addr: SocketAddr,
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Requests per second, in total.
    #[arg(long)]
    pub rate: u32,
    #[arg(long, default_value_t = 64)]
    pub conns: u32,
    /// Seconds of sending.
    #[arg(long)]
    pub duration: f64,
    /// Speak TLS 1.3 (one session per connection, kept alive); the certificate is not
    /// verified.
    #[arg(long)]
    pub tls: bool,
    /// The server name sent with `--tls` (SNI), also the `Host` header.
    #[arg(long, default_value = "localhost")]
    pub sni: String,
}

const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After the sending window, how long owed requests may still go out before they count as unsent.
const DRAIN_NS: u64 = 5_000_000_000;
/// A send this far behind its schedule counts as late.
const LATE_NS: u64 = 1_000_000;

/// CLOCK_MONOTONIC in nanoseconds (the clock timerfd deadlines use).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A one-shot timerfd registered with tokio: nanosecond deadlines.
struct Timer(AsyncFd<OwnedFd>);

impl Timer {
    fn new() -> io::Result<Timer> {
        // SAFETY: plain syscall; the fd is owned right away.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns; the OwnedFd keeps it open for
        // as long as the AsyncFd lives.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let registered = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) };
        Ok(Timer(registered?))
    }

    async fn sleep_until(&self, deadline_ns: u64) -> io::Result<()> {
        if mono_ns() >= deadline_ns {
            return Ok(());
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
            },
        };
        let fd = self.0.get_ref().as_raw_fd();
        // SAFETY: spec is valid; the old-value pointer may be null.
        let r = unsafe {
            libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            let mut guard = self.0.readable().await?;
            let res = guard.try_io(|inner| {
                let mut buf = [0u8; 8];
                // SAFETY: reads at most 8 bytes into buf.
                let n =
                    unsafe { libc::read(inner.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            if let Ok(r) = res {
                return r;
            }
        }
    }
}

#[derive(Default)]
struct ConnStats {
    latency_ns: Vec<u64>,
    errors: u64,
    non2xx: u64,
    late: u64,
    unsent: u64,
}

/// Runs the generator and prints its JSON report.
pub fn main(args: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let out = rt.block_on(generate(args))?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

async fn generate(a: Args) -> Result<LoadOutput> {
    if a.tls {
        let dial = Tls::new(a.addr, &a.sni, Profile::Openssl)?;
        let request = request(&a.path, &a.sni);
        return generate_with(&a, dial, request).await;
    }
    let request = request(&a.path, &a.addr.to_string());
    generate_with(&a, Plain(a.addr), request).await
}

/// Opens every connection, then runs the schedule over them.
async fn generate_with<D: Dial>(a: &Args, dial: D, request: Vec<u8>) -> Result<LoadOutput> {
    let conns = a.conns.max(1) as u64;
    let rate = a.rate.max(1) as u64;
    let mut streams = Vec::new();
    for _ in 0..conns {
        streams.push(
            dial.dial()
                .await
                .with_context(|| format!("connect {}", a.addr))?,
        );
    }
    let start = mono_ns() + 10_000_000;
    let end = start + (a.duration.max(0.0) * 1e9) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, stream) in streams.into_iter().enumerate() {
        let req = request.clone();
        let first = start + i as u64 * 1_000_000_000 / rate;
        let interval = conns * 1_000_000_000 / rate;
        tasks.spawn(conn_loop(dial.clone(), stream, req, first, interval, end));
    }
    let mut all = ConnStats::default();
    while let Some(r) = tasks.join_next().await {
        let s = r.context("connection task")?;
        all.latency_ns.extend(s.latency_ns);
        all.errors += s.errors;
        all.non2xx += s.non2xx;
        all.late += s.late;
        all.unsent += s.unsent;
    }
    let wall_s = (mono_ns().saturating_sub(start)) as f64 / 1e9;
    all.latency_ns.sort_unstable();
    let pct = |p| percentile_sorted(&all.latency_ns, p).map(|ns| ns as f64 / 1e3);
    let requests = all.latency_ns.len() as u64;
    Ok(LoadOutput {
        requests,
        duration_s: wall_s,
        rps: requests as f64 / wall_s.max(1e-9),
        p50_us: pct(50.0),
        p90_us: pct(90.0),
        p99_us: pct(99.0),
        p999_us: pct(99.9),
        errors: all.errors + all.unsent,
        non2xx: all.non2xx,
        late: Some(all.late),
        unsent: Some(all.unsent),
    })
}

async fn conn_loop<D: Dial>(
    dial: D,
    stream: D::Stream,
    req: Vec<u8>,
    first: u64,
    interval: u64,
    end: u64,
) -> ConnStats {
    let mut st = ConnStats::default();
    let owed = if first < end {
        (end - first).div_ceil(interval.max(1))
    } else {
        0
    };
    let Ok(timer) = Timer::new() else {
        st.unsent = owed;
        return st;
    };
    let mut stream = Some(stream);
    let mut buf = Vec::with_capacity(16 * 1024);
    for k in 0..owed {
        let due = first + k * interval;
        let now = mono_ns();
        if now > end + DRAIN_NS {
            st.unsent += owed - k;
            break;
        }
        if due > now {
            if timer.sleep_until(due).await.is_err() {
                st.unsent += owed - k;
                break;
            }
        } else if now - due > LATE_NS {
            st.late += 1;
        }
        if stream.is_none() {
            stream = dial.dial().await.ok();
        }
        let Some(s) = stream.as_mut() else {
            st.errors += 1;
            continue;
        };
        match tokio::time::timeout(RESPONSE_TIMEOUT, exchange(s, &req, &mut buf)).await {
            Ok(Ok((status, keep))) => {
                st.latency_ns.push(mono_ns().saturating_sub(due));
                if !(200..300).contains(&status) {
                    st.non2xx += 1;
                }
                if !keep {
                    stream = None;
                }
            }
            _ => {
                st.errors += 1;
                stream = None;
            }
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timerfd_sleeps_to_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let t = Timer::new().unwrap();
            let due = mono_ns() + 2_000_000;
            t.sleep_until(due).await.unwrap();
            assert!(mono_ns() >= due);
            // A deadline in the past returns at once.
            t.sleep_until(due).await.unwrap();
        });
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// 100 requests: 400 req/s for 0.25 s over 4 connections.
    fn hundred(addr: SocketAddr, path: &str, tls: bool) -> Args {
        Args {
            addr,
            path: path.into(),
            rate: 400,
            conns: 4,
            duration: 0.25,
            tls,
            sni: "localhost".into(),
        }
    }

    /// An HTTPS echo backend for `localhost`; the CA keeps the certificate files alive.
    fn tls_backend() -> (weir_testkit::certs::TestCa, weir_testkit::Backend) {
        let ca = weir_testkit::certs::TestCa::new("loadgen CA");
        let tls = weir_testkit::TlsServer::new(&ca.leaf(&["localhost"]));
        let b = weir_testkit::Backend::echo_tls("a", &tls);
        (ca, b)
    }

    #[test]
    fn generates_against_a_local_backend() {
        let b = weir_testkit::Backend::fixed(200, &[], "ok");
        let o = runtime()
            .block_on(generate(hundred(b.addr(), "/", false)))
            .unwrap();
        assert_eq!(o.errors, 0);
        assert_eq!(o.requests, 100);
        assert!(o.p50_us.unwrap() > 0.0);
        assert!(o.p999_us.unwrap() >= o.p50_us.unwrap());
    }

    #[test]
    fn generates_over_tls_keeping_one_session_per_connection() {
        let (_ca, b) = tls_backend();
        let o = runtime()
            .block_on(generate(hundred(b.addr(), "/tls", true)))
            .unwrap();
        assert_eq!((o.errors, o.non2xx, o.requests), (0, 0, 100));
        // Keep-alive: four handshakes for the hundred requests, each naming the server.
        assert_eq!(b.connections_accepted(), 4);
        assert_eq!(b.requests_served(), 100);
        assert_eq!(b.sni_seen(), vec!["localhost"; 4]);
        assert_eq!(b.tls_resumed(), 0);
    }

    #[test]
    fn tls_dial_opens_a_tls13_session_like_wrks() {
        let (_ca, b) = tls_backend();
        let t = Tls::new(b.addr(), "localhost", Profile::Openssl).unwrap();
        let alpn = &t.connector.config().alpn_protocols;
        assert_eq!(alpn, &vec![b"http/1.1".to_vec()]);
        let s = runtime().block_on(t.dial()).unwrap();
        let conn = s.get_ref().1;
        let version = conn.protocol_version();
        assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_3));
        let suite = conn.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(suite, rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
        assert!(Tls::new(b.addr(), "not a name!", Profile::Openssl).is_err());
    }
}
