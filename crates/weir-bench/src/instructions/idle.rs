//! Waiting until Weir's worker has nothing left to do: asleep in `epoll_wait`, as `/proc`
//! shows it (thread state `S`, current system call `epoll_wait`, `epoll_pwait` or
//! `epoll_pwait2`).
//!
//! The load of an instruction count sends each request only once the worker is idle, so that
//! every request finds Weir in the same state and wakes it exactly once: the count no longer
//! depends on how the machine's load happened to batch the requests (how many were waiting
//! when the worker woke, how often it slept). Without this, counts of the same build moved by
//! several percent on a busy machine; with it, a request's count includes exactly one sleep
//! and wake-up of the worker (two when it waits for an upstream).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The system calls a sleeping tokio runtime is in.
#[cfg(target_arch = "x86_64")]
const EPOLL_SYSCALLS: [libc::c_long; 3] = [
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
];
#[cfg(not(target_arch = "x86_64"))]
const EPOLL_SYSCALLS: [libc::c_long; 2] = [libc::SYS_epoll_pwait, libc::SYS_epoll_pwait2];
/// A worker that never goes idle is stuck (or busy with something else): the bound only
/// catches that.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Weir's worker thread (`weir-worker-0`, the one worker of the counted configuration).
pub struct Idle {
    task: PathBuf,
}

impl Idle {
    /// Finds the worker thread of process `pid` (the listening socket may be bound before
    /// the worker has started and named its thread).
    pub fn of(pid: u32) -> Result<Idle> {
        let tasks = Path::new("/proc").join(pid.to_string()).join("task");
        let deadline = Instant::now() + IDLE_TIMEOUT;
        loop {
            let entries =
                std::fs::read_dir(&tasks).with_context(|| format!("read {}", tasks.display()))?;
            for entry in entries {
                let task = entry?.path();
                let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
                if comm.trim_end() == "weir-worker-0" {
                    return Ok(Idle { task });
                }
            }
            if Instant::now() > deadline {
                bail!("no thread weir-worker-0 in process {pid}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Returns once the worker sleeps in `epoll_wait`.
    pub fn wait(&self) -> Result<()> {
        let deadline = Instant::now() + IDLE_TIMEOUT;
        while !self.is_idle()? {
            if Instant::now() > deadline {
                bail!("Weir's worker did not go idle within {IDLE_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    fn is_idle(&self) -> Result<bool> {
        let stat = std::fs::read_to_string(self.task.join("stat")).context("worker's stat")?;
        let syscall =
            std::fs::read_to_string(self.task.join("syscall")).context("worker's syscall")?;
        Ok(sleeping(&stat) && in_epoll_wait(&syscall))
    }
}

/// The state field of `/proc/.../stat` is `S` (after the command name, which may hold
/// spaces and parentheses, so after the last `)`).
fn sleeping(stat: &str) -> bool {
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'))
}

/// `/proc/.../syscall` starts with the number of the system call the thread is blocked in
/// (or `running`).
fn in_epoll_wait(syscall: &str) -> bool {
    syscall
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .is_some_and(|n| EPOLL_SYSCALLS.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_state_and_the_system_call() {
        assert!(sleeping("123 (weir-worker-0) S 1 2 3"));
        assert!(sleeping("123 (a) b) S 1"));
        assert!(!sleeping("123 (weir-worker-0) R 1 2 3"));
        assert!(in_epoll_wait(
            "232 0x3 0x7ffd 0x400 0xffffffff 0x0 0x0 0x7ffd 0x7f12\n"
        ));
        assert!(!in_epoll_wait("running\n"));
        assert!(!in_epoll_wait("202 0x1 0x2\n"));
    }
}
