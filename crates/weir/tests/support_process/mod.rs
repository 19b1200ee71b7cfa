//! Harness for the process-level tests: the real `weir` binary, started on a config file in a
//! temporary directory, with its stderr captured line by line (ANSI escapes stripped) so a
//! test can find the port a listener bound (`listening listener=NAME addr=127.0.0.1:PORT`)
//! and wait for log lines. The child is killed (SIGKILL) and reaped when the handle drops,
//! and the directory is removed, so a failing test never leaves a process behind.
//!
//! Plain blocking `std::net` I/O throughout, every read bounded by a timeout.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// How long to wait for Weir to start listening, or for a log line.
pub const START_WAIT: Duration = Duration::from_secs(20);

/// Default bound on one blocking read or write in these tests.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Temporary directory
// ---------------------------------------------------------------------------------------

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "weir-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `text` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path.join(name);
        std::fs::write(&p, text).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------------------
// Config text
// ---------------------------------------------------------------------------------------

/// A config: `[server]` with `workers = 1`, admin off, one listener `web` on `127.0.0.1:0`
/// with `listener_keys`, then `rest` (routes, upstreams) verbatim.
pub fn config(server_keys: &str, listener_keys: &str, rest: &str) -> String {
    format!(
        "[server]\nworkers = 1\n{server_keys}\n\n[admin]\nbind = \"off\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n{listener_keys}\n\n{rest}\n"
    )
}

/// A route named `name` for `prefix` to upstream `upstream` with one server `addr`.
pub fn route_to(name: &str, prefix: &str, addr: SocketAddr) -> String {
    format!(
        "[[listeners.routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"{name}\"\n\n\
         [upstreams.{name}]\nservers = [{{ addr = \"{addr}\" }}]\n\n"
    )
}

// ---------------------------------------------------------------------------------------
// The weir process
// ---------------------------------------------------------------------------------------

/// Removes ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// `addr` of a `listening listener=NAME addr=HOST:PORT` log line for listener `name`.
pub fn listening_addr(line: &str, name: &str) -> Option<SocketAddr> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == "listening")?;
    let fields: Vec<&str> = words.collect();
    let listener = format!("listener={name}");
    if !fields.contains(&listener.as_str()) {
        return None;
    }
    fields
        .iter()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.trim_matches('"').parse().ok())
}

/// The captured stderr of a child, line by line.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn capture(stderr: impl Read + Send + 'static) -> Log {
        let log = Log::default();
        let lines = log.0.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(strip_ansi(&line));
            }
        });
        log
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn text(&self) -> String {
        self.lines().join("\n")
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.0.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits until a line contains `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        weir_testkit::wait_until(timeout, || self.contains(needle))
    }

    /// Waits for the `listening` line of listener `name` on a line that also contains
    /// `marker` (say `listening (http_bind)`), and gives its address. Each listener logs its
    /// own line as it binds, so the first one's line says nothing of the others yet.
    pub fn listening(&self, name: &str, marker: &str, timeout: Duration) -> Option<SocketAddr> {
        let find = || {
            self.lines()
                .iter()
                .filter(|l| l.contains(marker))
                .find_map(|l| listening_addr(l, name))
        };
        weir_testkit::wait_until(timeout, || find().is_some());
        find()
    }
}

/// A running `weir` child process; SIGKILLed and reaped on drop.
pub struct Weir {
    child: Child,
    pub log: Log,
    /// The address the listener `web` bound.
    pub addr: SocketAddr,
    status: Option<ExitStatus>,
    _dir: Option<TempDir>,
    /// The config file `start` wrote.
    pub config_path: Option<PathBuf>,
}

impl Weir {
    /// Writes `config_text` to a temp dir and runs `weir run -c FILE` on it.
    pub fn start(config_text: &str) -> Weir {
        let dir = TempDir::new("run");
        let path = dir.write("weir.toml", config_text);
        let mut cmd = Command::new(WEIR);
        cmd.arg("run").arg("-c").arg(&path);
        let mut weir = Weir::spawn(cmd);
        weir._dir = Some(dir);
        weir.config_path = Some(path);
        weir
    }

    /// Runs `weir run -c path` on an existing file (kept by the caller, say across restarts).
    pub fn start_file(path: &Path) -> Weir {
        let mut cmd = Command::new(WEIR);
        cmd.arg("run").arg("-c").arg(path);
        let mut weir = Weir::spawn(cmd);
        weir.config_path = Some(path.to_path_buf());
        weir
    }

    /// The admin API's address, from the `admin api listening` log line.
    pub fn admin_addr(&self) -> SocketAddr {
        let find = || {
            self.log
                .lines()
                .iter()
                .filter(|l| l.contains("admin api listening"))
                .find_map(|l| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix("addr="))
                        .and_then(|a| a.trim_matches('"').parse().ok())
                })
        };
        weir_testkit::wait_until(START_WAIT, || find().is_some());
        find().unwrap_or_else(|| panic!("no admin address logged:\n{}", self.log.text()))
    }

    /// Runs `weir run -c FILE` under `sh -c 'ulimit -n LIMIT; exec weir run -c FILE'`; the
    /// shell execs, so the pid is Weir's.
    pub fn start_with_fd_limit(config_text: &str, limit: u32) -> Weir {
        let dir = TempDir::new("run-ulimit");
        let path = dir.write("weir.toml", config_text);
        let mut weir = Weir::spawn(fd_limited(&path, limit));
        weir._dir = Some(dir);
        weir
    }

    /// Spawns `cmd` (which must end up running `weir run`) and waits for listener `web` and
    /// for the signal handlers.
    pub fn spawn(cmd: Command) -> Weir {
        let mut weir = Weir::spawn_no_wait(cmd);
        let mut addr = None;
        let started = weir_testkit::wait_until(START_WAIT, || {
            addr = weir
                .log
                .lines()
                .iter()
                .find_map(|l| listening_addr(l, "web"));
            addr.is_some() || weir.exited()
        });
        match addr {
            Some(a) if started => weir.addr = a,
            _ => panic!(
                "weir did not report its listener (exited: {:?}); stderr:\n{}",
                weir.status,
                weir.log.text()
            ),
        }
        // `weir run` logs `listening` before it builds its signal runtime and installs the
        // SIGTERM / SIGINT handlers (run.rs). Until then a signal kills it outright and running
        // out of descriptors makes it exit, so wait for the handlers before going on.
        let handled = weir_testkit::wait_until(START_WAIT, || {
            weir.exited() || weir.catches(libc::SIGTERM) && weir.catches(libc::SIGINT)
        });
        assert!(
            handled && !weir.exited(),
            "weir did not install its signal handlers (exited: {:?}); stderr:\n{}",
            weir.status,
            weir.log.text()
        );
        weir
    }

    /// Spawns `cmd` with the log captured and returns at once (`addr` is unset).
    pub fn spawn_no_wait(mut cmd: Command) -> Weir {
        cmd.env("WEIR_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn weir");
        let log = Log::capture(child.stderr.take().expect("stderr piped"));
        Weir {
            child,
            log,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            status: None,
            _dir: None,
            config_path: None,
        }
    }

    /// Whether the process has a handler installed for `sig` (`SigCgt` in /proc/PID/status).
    pub fn catches(&self, sig: libc::c_int) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/status", self.pid())) else {
            return false;
        };
        text.lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid fits");
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): {}", io::Error::last_os_error());
    }

    /// True once the process has exited (reaps it).
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status.is_some()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        weir_testkit::wait_until(timeout, || self.exited());
        self.status
    }

    /// A field of /proc/PID/status in KiB (`VmHWM`, `VmRSS`).
    pub fn proc_status_kib(&self, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"))
    }

    /// Number of open file descriptors of the process.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `sh -c 'ulimit -n LIMIT && exec weir run -c PATH'`: the shell execs, so the pid is Weir's.
pub fn fd_limited(path: &Path, limit: u32) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" run -c \"$1\""))
        .arg(WEIR)
        .arg(path);
    cmd
}

/// Runs `weir check -c PATH` to completion (bounded: it is killed after 30 s).
pub fn weir_check(path: &Path) -> Output {
    let mut child = Command::new(WEIR)
        .arg("check")
        .arg("-c")
        .arg(path)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir check");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("weir check output")
}

/// Asserts that `weir check -c path` accepts the file with a `WARNING: {warning}...` line.
#[track_caller]
pub fn assert_check_warns(path: &Path, warning: &str) {
    let out = weir_check(path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(&format!("WARNING: {warning}")), "{stdout}");
}

// ---------------------------------------------------------------------------------------
// Blocking HTTP/1.1 over std::net
// ---------------------------------------------------------------------------------------

/// Connects with a bounded connect and sets read/write timeouts.
pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A response head: status, headers (lower-cased names), and any body bytes read past it.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub rest: Vec<u8>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.parse().ok()
    }
}

/// Reads a response head (up to 64 KiB) from `s`, using its read timeout.
pub fn read_head(s: &mut TcpStream) -> io::Result<Head> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("closed after {} head bytes", buf.len()),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, status_line.to_string()))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Head {
        status,
        headers,
        rest: buf[end..].to_vec(),
    })
}

/// Reads a Content-Length response (head + body) from `s`.
pub fn read_response(s: &mut TcpStream) -> io::Result<(Head, Vec<u8>)> {
    let head = read_head(s)?;
    let len = head.content_length().unwrap_or(0) as usize;
    let mut body = head.rest.clone();
    let mut chunk = [0u8; 4096];
    while body.len() < len {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "body cut"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Ok((head, body))
}

/// `GET path` with `Host: test` on `s`; returns the response.
pub fn get_on(s: &mut TcpStream, path: &str) -> io::Result<(Head, Vec<u8>)> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())?;
    read_response(s)
}

/// One `GET path` on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> io::Result<(Head, Vec<u8>)> {
    let mut s = connect(addr, Duration::from_secs(2))?;
    get_on(&mut s, path)
}

/// Sends `sig` to `pid` (a process the test started, directly or through an upgrade).
pub fn signal_pid(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// One request on a fresh connection (`Connection: close`); returns the head and the body.
/// `Host` is `addr` unless `headers` give one (the admin API answers only to its own
/// address).
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<(Head, String)> {
    let mut s = connect(addr, Duration::from_secs(2))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let (head, body) = read_response(&mut s)?;
    Ok((head, String::from_utf8_lossy(&body).into_owned()))
}

/// The `X-Backend` of a `GET /` on a fresh connection (which echo backend answered).
pub fn backend_of(addr: SocketAddr) -> String {
    let (head, _) = get(addr, "/").expect("response");
    head.header("x-backend").unwrap_or("").to_string()
}

/// True when a connection to `addr` is refused (nothing listens any more).
pub fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
    )
}
