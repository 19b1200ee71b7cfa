//! One Weir process under `valgrind --tool=callgrind`: its counters zeroed once the warm-up
//! requests are served and dumped after the counted ones (`callgrind_control`), and what the
//! dumped profile says: the total of user-space instructions (`Ir`) and each function's own
//! (exclusive) share, read with `callgrind_annotate`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::{self, Child, Spec};

/// Instructions by function (exclusive), as `callgrind_annotate` names them.
pub type Functions = BTreeMap<String, f64>;

/// A dumped profile file.
pub struct Profile(pub PathBuf);

/// Valgrind's start-up (reading Weir's symbols, translating its first code) is slow: the
/// bound only catches a Weir that never listens.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Weir exits within a drain of 0 s; under valgrind that still takes a while.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Weir running under callgrind.
pub struct Counted {
    child: Child,
    out: PathBuf,
}

impl Counted {
    /// Starts `weir run -c config` under callgrind (profiles dumped to `out.N`) and waits
    /// until `addr` accepts connections.
    pub fn start(weir: &Path, config: &Path, addr: SocketAddr, out: &Path) -> Result<Counted> {
        let spec = Spec::new(
            "weir (callgrind)",
            "valgrind",
            None,
            out.with_extension("log"),
        )
        .args([
            "--tool=callgrind".to_string(),
            format!("--callgrind-out-file={}", out.display()),
            weir.display().to_string(),
            "run".into(),
            "-c".into(),
            config.display().to_string(),
        ]);
        let mut child = process::spawn(&spec)?;
        process::wait_listening(addr, &mut child, START_TIMEOUT)?;
        Ok(Counted {
            child,
            out: out.to_path_buf(),
        })
    }

    /// Weir's process id (valgrind runs it in its own process).
    pub fn pid(&self) -> u32 {
        self.child.pgid as u32
    }

    /// Sets every counter to zero.
    pub fn zero(&self) -> Result<()> {
        self.control("-z")
    }

    /// Writes the counters since the zero to a file (the first dump: `out.1`).
    pub fn dump(&self) -> Result<Profile> {
        self.control("-d")?;
        let mut name = self.out.clone().into_os_string();
        name.push(".1");
        Ok(Profile(name.into()))
    }

    /// `callgrind_control FLAG PID`: it reaches a Weir asleep in `epoll_wait` through
    /// valgrind's gdbserver (vgdb), which needs to ptrace it.
    fn control(&self, flag: &str) -> Result<()> {
        let out = Command::new("callgrind_control")
            .args([flag, &self.pid().to_string()])
            .output()
            .context("run callgrind_control (Debian package valgrind)")?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !said.contains("OK") {
            bail!(
                "callgrind_control {flag} failed: {said} {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Stops Weir with SIGTERM and checks that it exited cleanly.
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.child.pgid, libc::SIGTERM) };
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(st) = self.child.exited() {
                break st;
            }
            if Instant::now() > deadline {
                bail!(
                    "Weir did not exit within {EXIT_TIMEOUT:?} of SIGTERM: {}",
                    self.child.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            bail!(
                "Weir under valgrind exited {status}: {}",
                self.child.log_tail()
            );
        }
        Ok(())
    }
}

impl Profile {
    /// The profile's total instruction count (`totals:` or, in older files, `summary:`).
    pub fn total(&self) -> Result<u64> {
        total_of(&self.text()?).with_context(|| format!("no totals in {}", self.0.display()))
    }

    /// Every function's exclusive instructions.
    pub fn functions(&self) -> Result<Functions> {
        Ok(functions_of(&self.text()?))
    }

    /// How many times `callee` was called (from anywhere).
    pub fn calls_to(&self, callee: &str) -> Result<u64> {
        Ok(calls_to(&self.text()?, callee))
    }

    fn text(&self) -> Result<String> {
        std::fs::read_to_string(&self.0).with_context(|| format!("read {}", self.0.display()))
    }
}

fn total_of(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Exclusive instructions by function, from the callgrind file format
/// (<https://valgrind.org/docs/manual/cl-format.html>): `fn=` names the function the cost
/// lines (`position cost`) that follow belong to, with names compressed as `(id) name` the
/// first time and `(id)` after; the cost line after a `calls=` line is the inclusive cost of
/// that call, not the caller's own. (`callgrind_annotate` 3.19 counts the call cost of a
/// call still in progress when the counters were zeroed, `calls=0`, as the caller's own.)
fn functions_of(text: &str) -> Functions {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut f = Functions::new();
    let mut current = "";
    let mut call_cost_next = false;
    for line in text.lines() {
        if let Some(def) = line.strip_prefix("fn=") {
            current = compressed_name(def, &mut names);
            continue;
        }
        if let Some(def) = line
            .strip_prefix("cfn=")
            .or_else(|| line.strip_prefix("cfi="))
            .or_else(|| line.strip_prefix("cfl="))
        {
            if line.starts_with("cfn=") {
                compressed_name(def, &mut names);
            }
            continue;
        }
        if line.starts_with("calls=") {
            call_cost_next = true;
            continue;
        }
        let first = line.as_bytes().first().copied().unwrap_or(b' ');
        if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*')) {
            continue;
        }
        if std::mem::take(&mut call_cost_next) {
            continue;
        }
        let cost: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        *f.entry(current.to_string()).or_default() += cost as f64;
    }
    f
}

/// The calls of `callee` the profile lists: the `calls=N` lines after a `cfn=` naming it.
fn calls_to(text: &str, callee: &str) -> u64 {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut current = "";
    let mut calls = 0;
    for line in text.lines() {
        if let Some(def) = line.strip_prefix("fn=") {
            compressed_name(def, &mut names);
        } else if let Some(def) = line.strip_prefix("cfn=") {
            current = compressed_name(def, &mut names);
        } else if let Some(n) = line.strip_prefix("calls=") {
            if current == callee {
                calls += n
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    calls
}

/// `(id) name` defines and returns `name`; `(id)` returns the name defined before; a name
/// without an id is itself.
fn compressed_name<'a>(def: &'a str, names: &mut BTreeMap<&'a str, &'a str>) -> &'a str {
    let Some(rest) = def.strip_prefix('(') else {
        return def;
    };
    let Some((id, name)) = rest.split_once(')') else {
        return def;
    };
    let name = name.trim_start();
    if name.is_empty() {
        names.get(id).copied().unwrap_or(def)
    } else {
        names.insert(id, name);
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_total_of_old_and_new_files() {
        assert_eq!(
            total_of("events: Ir\nfn=(1)\n0 5\ntotals: 123456\n"),
            Some(123456)
        );
        assert_eq!(total_of("events: Ir\nsummary: 77\n"), Some(77));
        assert_eq!(total_of("events: Ir\n"), None);
    }

    #[test]
    fn a_function_owns_its_cost_lines_but_not_its_calls() {
        let text = "\
events: Ir
summary: 1000

ob=(3) /usr/lib/libc.so.6
fl=(247) ./nptl/pthread_create.c
fn=(2296) start_thread
cob=(7) /x/weir
cfi=(152) ???
cfn=(2300) weir_core::serve::{{closure}}
calls=0 0
442 900

fl=(152)
fn=(2300)
0 700
+1 100
cfn=(2296)
calls=2 0
* 50
fn=(9) memcpy
-3 100
";
        let f = functions_of(text);
        assert_eq!(f.get("start_thread"), None, "{f:?}");
        assert_eq!(f["weir_core::serve::{{closure}}"], 800.0);
        assert_eq!(f["memcpy"], 100.0);
        assert_eq!(f.len(), 2);
        assert_eq!(calls_to(text, "start_thread"), 2);
        assert_eq!(calls_to(text, "weir_core::serve::{{closure}}"), 0);
    }
}
