//! `weir-bench tcp-bulk`: one TCP stream of several GiB through each L4 peer (Weir
//! `protocol = "tcp"`, HAProxy `mode tcp`), the proxy pinned to CPU 0; the figure is bytes
//! moved per CPU-second of the proxy (issue 6: at least HAProxy's).
//!
//! A source process on CPU 1 (`weir-bench bulk-source`) writes the bytes to every connection
//! it accepts and closes; the harness, also on CPU 1, reads them through the proxy and
//! discards them. The proxy's utime + stime over the transfer comes from `/proc`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::peers::{self, Peer, Route};
use crate::process::{self, Spec};
use crate::{procfs, LOAD_CPU, PROXY_CPU};

const CHUNK: usize = 1 << 20;

/// Arguments of `tcp-bulk`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// GiB sent through each proxy.
    #[arg(long, default_value_t = 4)]
    pub gib: u64,
    /// The Weir binary (default: build target/release/weir with cargo first).
    #[arg(long)]
    pub weir: Option<PathBuf>,
}

/// Arguments of the hidden `bulk-source` helper.
#[derive(clap::Args, Debug, Clone)]
pub struct SourceArgs {
    #[arg(long)]
    pub bytes: u64,
}

/// The source: announces `ADDR ip:port`, then writes `bytes` to each connection and closes it.
pub fn source_main(a: SourceArgs) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("ADDR {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let chunk = vec![b'x'; CHUNK];
    for stream in listener.incoming() {
        let mut s = stream?;
        let mut left = a.bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            if s.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
    }
    Ok(())
}

/// One peer's transfer.
struct Transfer {
    peer: Peer,
    bytes: u64,
    secs: f64,
    proxy_cpu_s: f64,
}

impl Transfer {
    fn gib_per_cpu_s(&self) -> f64 {
        self.bytes as f64 / self.proxy_cpu_s.max(1e-9) / (1u64 << 30) as f64
    }
}

/// Runs the transfer through each L4 peer and prints a markdown table.
pub fn main(a: Args, weir: PathBuf, dir: &Path) -> Result<()> {
    let bytes = a.gib.max(1) << 30;
    let self_exe = std::env::current_exe()?;
    let spec = Spec::new(
        "bulk-source",
        self_exe,
        Some(LOAD_CPU),
        dir.join("bulk-source.log"),
    )
    .args(["bulk-source".to_string(), format!("--bytes={bytes}")])
    .piped();
    let mut source = process::spawn(&spec)?;
    let line = source.stdout_lines(1)?.join("");
    let addr: SocketAddr = line
        .strip_prefix("ADDR ")
        .unwrap_or(&line)
        .parse()
        .with_context(|| format!("bulk source announced {line:?}"))?;
    let mut rows = Vec::new();
    for peer in [Peer::WeirTcp, Peer::HaproxyTcp] {
        match transfer(peer, addr, bytes, &weir, dir) {
            Ok(t) => rows.push(t),
            Err(e) => eprintln!("weir-bench: tcp-bulk: {} skipped: {e:#}", peer.name()),
        }
    }
    print!("{}", table(&rows, a.gib));
    Ok(())
}

fn transfer(
    peer: Peer,
    source: SocketAddr,
    bytes: u64,
    weir: &Path,
    dir: &Path,
) -> Result<Transfer> {
    let backends = [source];
    let setup = peers::Setup {
        dir,
        backends: &backends,
        route: Route::Proxy,
        max_conns: 64,
        weir,
        admin: false,
        tls: None,
    };
    let started = peers::start(peer, &setup, PROXY_CPU)?;
    let pgid = started.child.pgid;
    let mut s = TcpStream::connect(started.addr)?;
    let cpu_before = procfs::group_cpu_secs(pgid);
    let t0 = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => break,
            n => got += n as u64,
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let proxy_cpu_s = procfs::group_cpu_secs(pgid) - cpu_before;
    if got != bytes {
        bail!("received {got} of {bytes} bytes");
    }
    Ok(Transfer {
        peer,
        bytes,
        secs,
        proxy_cpu_s,
    })
}

fn table(rows: &[Transfer], gib: u64) -> String {
    let mut out = format!(
        "## tcp-bulk: one {gib} GiB stream through each L4 proxy (proxy on CPU {PROXY_CPU})\n\n\
         | peer | seconds | GiB/s | proxy CPU s | GiB per proxy CPU-second | vs haproxy-tcp |\n\
         |---|---|---|---|---|---|\n"
    );
    let base = rows
        .iter()
        .find(|t| t.peer == Peer::HaproxyTcp)
        .map(Transfer::gib_per_cpu_s);
    for t in rows {
        let ratio = base.map_or("n/a".to_string(), |b| {
            format!("{:.2}x", t.gib_per_cpu_s() / b)
        });
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {ratio} |\n",
            t.peer.name(),
            t.secs,
            t.bytes as f64 / t.secs / (1u64 << 30) as f64,
            t.proxy_cpu_s,
            t.gib_per_cpu_s(),
        ));
    }
    out
}
