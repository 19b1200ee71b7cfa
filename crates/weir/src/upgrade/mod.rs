//! Zero-downtime binary upgrade (`weir upgrade` / SIGUSR2).
//!
//! The old process creates a unix socket (in a directory only its user may enter), starts
//! the binary at its own path (a new build installed there) with `run -c CONFIG
//! --upgrade-from SOCKET`, and sends it every listening socket (each worker's, plus the
//! admin listener's) with `SCM_RIGHTS`. The first message's data is a JSON manifest: per
//! bind of a listener, its name, socket count and whether it is a plain-HTTP bind of a TLS
//! listener, and the total count of sockets. A message carries at most 253 descriptors
//! (`SCM_MAX_FD`): the first takes the first 253, each further message (one byte of data)
//! the next 253, until all are sent. With 253 sockets or fewer that is the single message
//! earlier versions sent and expect. The new process starts on those very sockets, so
//! connections waiting in their accept queues are never reset, and answers `ready`. Only
//! then does the old process stop accepting and drain like on SIGTERM. If the new process
//! fails at any point, or does not report ready within 60 s, the old one stops it and keeps
//! serving.

mod sys;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use weir_core::{Inherited, InheritedBind};

pub use sys::kill;

/// How long the new process may take to connect and to report ready.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(60);
const READY: &str = "ready";
/// The data of the messages after the first (descriptors need a byte to ride on).
const MORE: &[u8] = b"+";

/// What the old process hands over: listener sockets by name, and the admin socket.
pub struct Sockets {
    pub listeners: Inherited,
    pub admin: Option<TcpListener>,
}

/// The old side: starts `exe` on `config` and hands it `sockets`. Returns the new pid
/// once it is ready; the caller then drains and exits.
pub fn hand_over(exe: &Path, config: &Path, sockets: Sockets) -> anyhow::Result<u32> {
    let dir = private_dir()?;
    let path = dir.0.join("upgrade.sock");
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    listener.set_nonblocking(true)?;
    let mut child = Command::new(exe)
        .arg("run")
        .arg("-c")
        .arg(config)
        .arg("--upgrade-from")
        .arg(&path)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let handshake = accept_from(&listener, &mut child).and_then(|stream| {
        send_sockets(&stream, &sockets)?;
        await_ready(&stream, HANDOVER_TIMEOUT)
    });
    if let Err(e) = handshake {
        // Stopped and reaped whatever went wrong: a new process left running would hold
        // the listening sockets, start serving late, and stay a zombie of this one.
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child.id())
}

/// A directory only this user may enter, for the handover socket: the first process to
/// connect to it gets the listening sockets, so no other user must be able to.
fn private_dir() -> anyhow::Result<RemoveOnDrop> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!(
        "weir-upgrade-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(RemoveOnDrop(dir))
}

/// Waits for the new process's `ready` line, at most `timeout`.
fn await_ready(stream: &UnixStream, timeout: Duration) -> anyhow::Result<()> {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    stream.set_read_timeout(Some(timeout))?;
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Err(e) if matches!(e.kind(), WouldBlock | TimedOut) => {
            bail!("the new process did not report ready within {timeout:?}: it is stopped")
        }
        Err(e) => Err(e).context("waiting for the new process to report ready"),
        Ok(_) if line.trim() == READY => Ok(()),
        Ok(_) => bail!("the new process did not start (see its log above)"),
    }
}

/// Waits for the new process to connect; fails if it exits or takes too long.
fn accept_from(
    listener: &UnixListener,
    child: &mut std::process::Child,
) -> anyhow::Result<UnixStream> {
    let deadline = Instant::now() + HANDOVER_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                // A new process that connects and never reads must not hold this one in
                // the sockets' send once their messages fill the socket buffer.
                stream.set_write_timeout(Some(HANDOVER_TIMEOUT))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(status) = child.try_wait()? {
            bail!("the new process exited before taking the sockets ({status})");
        }
        if Instant::now() > deadline {
            bail!("the new process did not connect within {HANDOVER_TIMEOUT:?}");
        }
        // A short poll: this runs once per upgrade, off the data plane.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn send_sockets(stream: &UnixStream, sockets: &Sockets) -> anyhow::Result<()> {
    let mut fds = Vec::new();
    let mut listeners = Vec::new();
    for bind in &sockets.listeners {
        listeners.push(json!({
            "name": bind.listener,
            "count": bind.sockets.len(),
            "plain_http": bind.plain_http,
        }));
        fds.extend(bind.sockets.iter().map(AsRawFd::as_raw_fd));
    }
    if let Some(admin) = &sockets.admin {
        fds.push(admin.as_raw_fd());
    }
    let manifest = json!({
        "listeners": listeners,
        "admin": sockets.admin.is_some(),
        "sockets": fds.len(),
    });
    send_in_chunks(stream, manifest.to_string().as_bytes(), &fds)
        .with_context(|| format!("sending {} sockets", fds.len()))
}

/// Sends `fds` in messages of at most [`sys::MAX_FDS`]: the first with `first` as data,
/// the others with one byte (a message needs some data to carry descriptors).
fn send_in_chunks(stream: &UnixStream, first: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut chunks = fds.chunks(sys::MAX_FDS);
    sys::send_with_fds(stream, first, chunks.next().unwrap_or_default())?;
    for chunk in chunks {
        sys::send_with_fds(stream, MORE, chunk)?;
    }
    Ok(())
}

/// Receives a message of [`send_in_chunks`]: the first message's data (into `buf`) and
/// every descriptor: as many as the data (a manifest) announces.
fn recv_in_chunks(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let (n, mut fds) = sys::recv_with_fds(stream, buf)?;
    // An older sender does not say: it sent them all in this one message.
    let total = socket_count(&buf[..n]).unwrap_or(fds.len());
    let mut more = [0u8; 1];
    while fds.len() < total {
        let (got, chunk) = sys::recv_with_fds(stream, &mut more)?;
        if got == 0 || chunk.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} sockets received of {total}", fds.len()),
            ));
        }
        fds.extend(chunk);
    }
    Ok((n, fds))
}

/// The count of sockets a manifest announces (`None` from a version that sent one message).
fn socket_count(manifest: &[u8]) -> Option<usize> {
    let manifest: Value = serde_json::from_slice(manifest).ok()?;
    usize::try_from(manifest["sockets"].as_u64()?).ok()
}

/// The new side: the sockets received, and the line to report ready on.
pub struct Handover {
    pub sockets: Sockets,
    stream: UnixStream,
}

impl Handover {
    /// Connects to the old process at `path` and takes its sockets.
    pub fn receive(path: &Path) -> anyhow::Result<Handover> {
        let stream = UnixStream::connect(path)
            .with_context(|| format!("connecting to {}", path.display()))?;
        stream.set_read_timeout(Some(HANDOVER_TIMEOUT))?;
        let mut buf = vec![0u8; 64 * 1024];
        let (n, fds) = recv_in_chunks(&stream, &mut buf).context("receiving the sockets")?;
        let manifest: Value =
            serde_json::from_slice(&buf[..n]).context("reading the upgrade manifest")?;
        let sockets = unpack(&manifest, fds)?;
        Ok(Handover { sockets, stream })
    }

    /// The sockets, and the handle to report ready with once they accept.
    pub fn split(self) -> (Sockets, Ready) {
        (self.sockets, Ready(self.stream))
    }
}

/// Reports to the old process that the new one accepts.
pub struct Ready(UnixStream);

impl Ready {
    /// Tells the old process to drain and exit.
    pub fn ready(mut self) -> std::io::Result<()> {
        writeln!(self.0, "{READY}")
    }
}

fn unpack(manifest: &Value, fds: Vec<OwnedFd>) -> anyhow::Result<Sockets> {
    let mut fds = fds.into_iter();
    let mut listeners = Vec::new();
    for l in manifest["listeners"].as_array().into_iter().flatten() {
        let name = l["name"]
            .as_str()
            .ok_or_else(|| anyhow!("manifest: listener without a name"))?;
        let count = l["count"].as_u64().unwrap_or(0);
        let mut socks = Vec::new();
        for _ in 0..count {
            let fd = fds
                .next()
                .ok_or_else(|| anyhow!("manifest: fewer sockets than announced"))?;
            socks.push(TcpListener::from(fd));
        }
        listeners.push(InheritedBind {
            listener: name.to_string(),
            // Absent in the manifest of a version without `http_bind`: its listeners had
            // one kind of bind.
            plain_http: l["plain_http"].as_bool().unwrap_or(false),
            sockets: socks,
        });
    }
    let admin = match manifest["admin"].as_bool() {
        Some(true) => Some(TcpListener::from(
            fds.next()
                .ok_or_else(|| anyhow!("manifest: no admin socket"))?,
        )),
        _ => None,
    };
    Ok(Sockets { listeners, admin })
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Was: more than 253 sockets (`SCM_MAX_FD`) could not be handed over at all. Over
    /// a socket pair, 2 x 253 + 1 listening sockets go across in three messages, in order.
    #[test]
    fn more_sockets_than_one_message_carries_cross_in_order() {
        // Three listeners sent over and over (a descriptor may go more than once), so the
        // test holds about 500 descriptors at its peak, not twice that; three does not
        // divide a message's 253, so a message out of order shifts the pattern.
        let sent: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let n = 2 * sys::MAX_FDS + 1;
        let addrs: Vec<_> = (0..n).map(|i| sent[i % 3].local_addr().unwrap()).collect();
        let fds: Vec<RawFd> = (0..n).map(|i| sent[i % 3].as_raw_fd()).collect();
        let (a, b) = UnixStream::pair().unwrap();
        let manifest = json!({ "sockets": fds.len() }).to_string();
        // The receiver reads while the sender writes: the messages need not fit the buffer.
        let receiver = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let (n, fds) = recv_in_chunks(&b, &mut buf).unwrap();
            (buf[..n].to_vec(), fds)
        });
        send_in_chunks(&a, manifest.as_bytes(), &fds).unwrap();
        drop(sent);
        let (data, got) = receiver.join().unwrap();
        assert_eq!(data, manifest.as_bytes());
        let got: Vec<_> = got
            .into_iter()
            .map(|fd| TcpListener::from(fd).local_addr().unwrap())
            .collect();
        assert_eq!(got, addrs);
    }

    /// Was: "Resource temporarily unavailable (os error 11)" after 60 s, the new process
    /// left running. Now the message says what happened (the caller stops the process).
    #[test]
    fn a_new_process_that_never_reports_ready_is_named_at_the_timeout() {
        let (a, _b) = UnixStream::pair().unwrap();
        let e = await_ready(&a, Duration::from_millis(50)).unwrap_err();
        let message = format!("{e:#}");
        assert!(
            message.contains("did not report ready within 50ms"),
            "{message}"
        );
    }

    /// A sender of an earlier version: one message and no count in it.
    #[test]
    fn one_message_without_a_count_is_taken_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        sys::send_with_fds(&a, b"{}", &[listener.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_in_chunks(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"{}"[..], 1));
    }
}
