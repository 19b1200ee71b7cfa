//! Child processes and their cleanup, free ports, readiness and a tiny HTTP probe.
//!
//! Every child (peer, backend, load generator) is started with `taskset -c CPU`, in a process
//! group of its own (so its workers can be counted and killed together) and with
//! `PR_SET_PDEATHSIG` (so it dies with the harness). Dropping a [`Child`] terminates its
//! group; Ctrl-C, SIGTERM and a panic kill every group still registered.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

const SLOTS: usize = 64;
static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

fn register(pgid: i32) -> Option<usize> {
    GROUPS.iter().position(|s| {
        s.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })
}

/// Kills every registered process group. Async-signal-safe (atomics and `kill` only).
pub fn kill_all() {
    for slot in &GROUPS {
        let g = slot.swap(0, Ordering::SeqCst);
        if g > 0 {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    kill_all();
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(128 + sig) };
}

/// Installs the Ctrl-C / SIGTERM / SIGHUP handlers and a panic hook that kill all children.
/// (The release profile aborts on panic, so `Drop` alone would not run.)
pub fn install_cleanup() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only touches atomics and calls async-signal-safe functions.
        unsafe { libc::signal(sig, handler) };
    }
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        kill_all();
        default(info);
    }));
}

/// Pins the calling process (the harness itself) to `cpu`, so its own polling stays off the
/// proxy's core. Best effort.
pub fn pin_self(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// What to run and where.
pub struct Spec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    /// `taskset -c CPU`, or no pinning.
    pub cpu: Option<usize>,
    /// Where stderr goes (a log file in the run's temp dir).
    pub log: PathBuf,
    /// Pipe stdout to the harness (load generators, backends announcing addresses);
    /// otherwise it goes to the log file too, so a chatty peer cannot fill a pipe and stall.
    pub pipe_stdout: bool,
}

impl Spec {
    pub fn new(name: &str, program: impl Into<PathBuf>, cpu: Option<usize>, log: PathBuf) -> Spec {
        Spec {
            name: name.to_string(),
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            cpu,
            log,
            pipe_stdout: false,
        }
    }

    pub fn piped(mut self) -> Spec {
        self.pipe_stdout = true;
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Spec {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Spec {
        self.envs.push((k.into(), v.into()));
        self
    }
}

/// A running child process group; terminated (SIGTERM, then SIGKILL) when dropped.
pub struct Child {
    pub name: String,
    pub pgid: i32,
    pub log: PathBuf,
    child: std::process::Child,
    slot: Option<usize>,
    reaped: bool,
}

/// Starts `spec`. A piped stdout is read with [`Child::finish`] or [`Child::stdout_lines`].
pub fn spawn(spec: &Spec) -> Result<Child> {
    let mut cmd = match spec.cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(&spec.program);
            c
        }
        None => Command::new(&spec.program),
    };
    let log = File::create(&spec.log).with_context(|| format!("create {}", spec.log.display()))?;
    let stdout = if spec.pipe_stdout {
        Stdio::piped()
    } else {
        Stdio::from(log.try_clone()?)
    };
    cmd.args(&spec.args)
        .envs(spec.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log)
        .process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("start {} ({})", spec.name, spec.program.display()))?;
    let pgid = child.id() as i32;
    Ok(Child {
        name: spec.name.clone(),
        pgid,
        log: spec.log.clone(),
        slot: register(pgid),
        child,
        reaped: false,
    })
}

/// How a child that ran to completion ended.
pub struct Finished {
    pub stdout: String,
    pub status: ExitStatus,
    /// The child's own user + system CPU time (from `wait4`), in seconds.
    pub cpu_secs: f64,
}

impl Child {
    /// Whether the process (group leader) has exited, with its status.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.reaped {
            return None;
        }
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of the child's stderr log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Reads the first `n` lines of stdout (a backend announcing its addresses).
    pub fn stdout_lines(&mut self, n: usize) -> Result<Vec<String>> {
        let out = self
            .child
            .stdout
            .as_mut()
            .ok_or_else(|| anyhow!("no stdout"))?;
        let mut lines = Vec::new();
        let mut cur = Vec::new();
        let mut byte = [0u8; 1];
        while lines.len() < n {
            if out.read(&mut byte)? == 0 {
                bail!("{} exited early: {}", self.name, self.log_tail());
            }
            if byte[0] == b'\n' {
                lines.push(String::from_utf8_lossy(&cur).into_owned());
                cur.clear();
            } else {
                cur.push(byte[0]);
            }
        }
        Ok(lines)
    }

    /// Waits for the child to exit and returns its stdout and CPU time.
    pub fn finish(mut self) -> Result<Finished> {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut stdout)?;
        }
        let mut status = 0;
        // SAFETY: a zeroed rusage is valid; wait4 writes into the two locals.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = self.child.id() as libc::pid_t;
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r != pid {
            bail!("wait4 {}: {}", self.name, std::io::Error::last_os_error());
        }
        self.reaped = true;
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        use std::os::unix::process::ExitStatusExt;
        Ok(Finished {
            stdout,
            status: ExitStatus::from_raw(status),
            cpu_secs: tv(usage.ru_utime) + tv(usage.ru_stime),
        })
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-self.pgid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < deadline {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Workers that outlived their leader, or a leader that ignored SIGTERM.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        if !self.reaped {
            let _ = self.child.wait();
        }
        if let Some(s) = self.slot {
            GROUPS[s].store(0, Ordering::SeqCst);
        }
    }
}

/// Raises the open-file limit the children inherit: to 262144 where allowed (root), else
/// the soft limit to the hard one.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return;
        }
        let want = 262_144;
        if r.rlim_max < want {
            let big = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &big) == 0 {
                return;
            }
        }
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The open-file limit (soft) this process, and so each child, has.
pub fn fd_limit() -> u64 {
    // SAFETY: getrlimit with a valid struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur
    }
}

/// A free loopback port: bind `127.0.0.1:0`, note the port, release it.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind(("127.0.0.1", 0)).context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Starts `weir run -c DIR/weir-TAG.toml` (written beforehand; log `DIR/weir-TAG.log`,
/// `WEIR_LOG=warn`, pinned to `cpu`) and waits until it listens on `port` of 127.0.0.1.
pub fn spawn_weir(
    weir: &Path,
    dir: &Path,
    tag: &str,
    cpu: Option<usize>,
    port: u16,
) -> Result<(SocketAddr, Child)> {
    let config = dir.join(format!("weir-{tag}.toml"));
    let spec = Spec::new(
        &format!("weir-{tag}"),
        weir,
        cpu,
        dir.join(format!("weir-{tag}.log")),
    )
    .args([
        "run".to_string(),
        "-c".into(),
        config.to_string_lossy().into_owned(),
    ])
    .env("WEIR_LOG", "warn");
    let mut child = spawn(&spec)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok((addr, child))
}

/// Waits until `addr` accepts connections, failing early if `child` exits.
pub fn wait_listening(addr: SocketAddr, child: &mut Child, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.exited() {
            bail!("{} exited ({st}): {}", child.name, child.log_tail());
        }
        if Instant::now() > deadline {
            bail!(
                "{} not listening on {addr} after {timeout:?}: {}",
                child.name,
                child.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A response from [`http_get`].
#[derive(Debug)]
pub struct Probe {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Probe {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One `GET` with `Connection: close`, read to EOF: checks a peer before it is measured.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<Probe> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(n) = resp.parse(&buf)? else {
        bail!("incomplete response head from {addr}{path}");
    };
    Ok(Probe {
        status: resp.code.unwrap_or(0),
        headers: resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: buf[n..].to_vec(),
    })
}

/// A program on `PATH` (or in the sbin directories, which a non-root `PATH` may lack).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMPDIR/<prefix>-<pid>`. Directories of earlier runs whose process is gone (a run
    /// stopped by Ctrl-C exits without unwinding) are removed first.
    pub fn new(prefix: &str) -> Result<TempDir> {
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let stale = name
                    .strip_prefix(&format!("{prefix}-"))
                    .and_then(|pid| pid.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if stale {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let p = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    /// Removes the directory, unless `WEIR_BENCH_KEEP_TMP` is set (to read the generated
    /// configurations and the peers' logs).
    fn drop(&mut self) {
        if std::env::var_os("WEIR_BENCH_KEEP_TMP").is_some() {
            eprintln!("weir-bench: kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let a = free_port().unwrap();
        assert!(a > 0);
        assert!(TcpListener::bind(("127.0.0.1", a)).is_ok());
    }

    #[test]
    fn finds_sh_and_not_nonsense() {
        assert!(find_program("sh").is_some());
        assert!(find_program("surely-not-a-program-xyz").is_none());
    }
}
