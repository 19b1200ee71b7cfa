//! Zero-downtime binary upgrade (`weir upgrade` / SIGUSR2).
//!
//! The old process creates a unix socket, starts the binary at its own path (a new build
//! installed there) with `run -c CONFIG --upgrade-from SOCKET`, and sends it every
//! listening socket (each worker's, plus the admin listener's) with `SCM_RIGHTS` in one
//! message whose data is a JSON manifest: per bind of a listener, its name, socket count
//! and whether it is a plain-HTTP bind of a TLS listener. The new process starts on
//! those very sockets, so connections waiting in their accept queues are never reset, and
//! answers `ready`. Only then does the old process stop accepting and drain like on
//! SIGTERM. If the new process fails at any point, the old one keeps serving.

mod sys;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
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

/// What the old process hands over: listener sockets by name, and the admin socket.
pub struct Sockets {
    pub listeners: Inherited,
    pub admin: Option<TcpListener>,
}

/// The old side: starts `exe` on `config` and hands it `sockets`. Returns the new pid
/// once it is ready; the caller then drains and exits.
pub fn hand_over(exe: &Path, config: &Path, sockets: Sockets) -> anyhow::Result<u32> {
    let path = std::env::temp_dir().join(format!(
        "weir-upgrade-{}-{}.sock",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let _cleanup = RemoveOnDrop(path.clone());
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
    let pid = child.id();
    let stream = match accept_from(&listener, &mut child) {
        Ok(s) => s,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    send_sockets(&stream, &sockets)?;
    stream.set_read_timeout(Some(HANDOVER_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    if line.trim() != READY {
        let _ = child.wait();
        bail!("the new process did not start (see its log above)");
    }
    Ok(pid)
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
    if fds.len() > sys::MAX_FDS {
        bail!(
            "{} sockets are more than one message can carry ({})",
            fds.len(),
            sys::MAX_FDS
        );
    }
    let manifest = json!({"listeners": listeners, "admin": sockets.admin.is_some()});
    sys::send_with_fds(stream, manifest.to_string().as_bytes(), &fds)?;
    Ok(())
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
        let (n, fds) = sys::recv_with_fds(&stream, &mut buf)?;
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
        let _ = std::fs::remove_file(&self.0);
    }
}
