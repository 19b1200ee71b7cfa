//! Reading `/proc`: CPU time (utime + stime) and peak RSS (VmHWM) of a process group, and
//! the per-CPU busy time from `/proc/stat`.
//!
//! Every peer runs in its own process group (see `process.rs`), so "the proxy's processes"
//! are the processes whose `pgrp` is the group id: the nginx master and worker, Apache's
//! parent and child, one Weir or HAProxy process. `/proc/PID/stat` counts all threads of a
//! process, so summing over the group's processes covers every thread.

use std::fs;

/// The fields of `/proc/PID/stat` the harness uses; times in clock ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidStat {
    pub pid: i32,
    pub comm: String,
    pub pgrp: i32,
    pub utime: u64,
    pub stime: u64,
}

/// Parses one `/proc/PID/stat` line. The command name sits in parentheses and may itself
/// contain spaces and parentheses, so the fields are counted from the last `)`.
pub fn parse_pid_stat(line: &str) -> Option<PidStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let comm = line[open + 1..close].to_string();
    // After ")": state(3) ppid(4) pgrp(5) ... utime(14) stime(15): index = field - 3.
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    Some(PidStat {
        pid,
        comm,
        pgrp: rest.get(2)?.parse().ok()?,
        utime: rest.get(11)?.parse().ok()?,
        stime: rest.get(12)?.parse().ok()?,
    })
}

/// `VmHWM` (peak resident set) from a `/proc/PID/status` text, in KiB.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Clock ticks per second (`USER_HZ`) for the times in `/proc/PID/stat`.
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The processes now in process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<PidStat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_pid_stat(&s))
        .filter(|s| s.pgrp == pgid)
        .collect()
}

/// utime + stime of all processes of group `pgid`, in seconds.
pub fn group_cpu_secs(pgid: i32) -> f64 {
    let (user, system) = group_cpu_split(pgid);
    user + system
}

/// utime and stime (user space, kernel) of all processes of group `pgid`, in seconds: a
/// proxy's kernel time is mostly its sockets' TCP work, which only fewer system calls lower.
pub fn group_cpu_split(pgid: i32) -> (f64, f64) {
    let members = group_members(pgid);
    let user: u64 = members.iter().map(|p| p.utime).sum();
    let system: u64 = members.iter().map(|p| p.stime).sum();
    (user as f64 / clk_tck(), system as f64 / clk_tck())
}

/// The sum of the group's processes' peak RSS (VmHWM), in KiB: an upper bound on the
/// group's peak, exact for a single process.
pub fn group_peak_rss_kib(pgid: i32) -> Option<u64> {
    let v: Vec<u64> = group_members(pgid)
        .iter()
        .filter_map(|p| fs::read_to_string(format!("/proc/{}/status", p.pid)).ok())
        .filter_map(|s| parse_vm_hwm_kib(&s))
        .collect();
    if v.is_empty() {
        None
    } else {
        Some(v.iter().sum())
    }
}

/// `voluntary_ctxt_switches` from a `/proc/PID/task/TID/status` text: how often the thread
/// blocked (for a proxy worker: `epoll_wait` calls that slept).
pub fn parse_voluntary_switches(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Voluntary context switches of every thread of every process of group `pgid` (each
/// thread's own count is in its `task/TID/status`; a process's `status` has only its
/// main thread's).
pub fn group_sleeps(pgid: i32) -> u64 {
    let task_status = |pid: i32| -> Vec<String> {
        let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|t| fs::read_to_string(t.path().join("status")).ok())
            .collect()
    };
    group_members(pgid)
        .iter()
        .flat_map(|p| task_status(p.pid))
        .filter_map(|s| parse_voluntary_switches(&s))
        .sum()
}

/// Resets the peak RSS of the group's processes (`echo 5 > /proc/PID/clear_refs`, Linux 4.0+),
/// so each case reports its own peak. Best effort: without permission the peak since start
/// is reported instead.
pub fn reset_peak_rss(pgid: i32) {
    for p in group_members(pgid) {
        let _ = fs::write(format!("/proc/{}/clear_refs", p.pid), "5");
    }
}

/// One CPU's line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Time spent running tasks (user, nice, system): what a process's utime + stime can
    /// account for. Interrupt time is left out.
    pub fn task_ticks(&self) -> u64 {
        self.user + self.nice + self.system
    }
}

/// The `cpuN` line of a `/proc/stat` text.
pub fn parse_proc_stat_cpu(stat: &str, cpu: usize) -> Option<CpuTimes> {
    let label = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    if v.len() < 4 {
        return None;
    }
    Some(CpuTimes {
        user: get(0),
        nice: get(1),
        system: get(2),
        idle: get(3),
        iowait: get(4),
        irq: get(5),
        softirq: get(6),
        steal: get(7),
    })
}

/// The current times of CPU `cpu`, if `/proc/stat` can be read.
pub fn cpu_times(cpu: usize) -> Option<CpuTimes> {
    parse_proc_stat_cpu(&fs::read_to_string("/proc/stat").ok()?, cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NGINX_WORKER: &str = "18419 (nginx) S 18416 18416 18416 0 -1 4194624 1203 0 0 0 \
        1734 2318 0 0 20 0 1 0 563012 13844480 1514 18446744073709551615 1 1 0 0 0 0 0 \
        1073745920 402745863 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn parses_pid_stat() {
        let s = parse_pid_stat(NGINX_WORKER).unwrap();
        assert_eq!(s.pid, 18419);
        assert_eq!(s.comm, "nginx");
        assert_eq!(s.pgrp, 18416);
        assert_eq!((s.utime, s.stime), (1734, 2318));
    }

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let line = "77 (tokio (rt) w 1) R 1 70 70 0 -1 0 0 0 0 0 5 6 0 0 20 0 4 0 1 1 1";
        let s = parse_pid_stat(line).unwrap();
        assert_eq!(s.comm, "tokio (rt) w 1");
        assert_eq!((s.pgrp, s.utime, s.stime), (70, 5, 6));
    }

    #[test]
    fn rejects_truncated_stat() {
        assert!(parse_pid_stat("12 (x) S 1 2").is_none());
        assert!(parse_pid_stat("garbage").is_none());
    }

    #[test]
    fn parses_voluntary_switches_and_counts_a_process_group() {
        let status =
            "Name:\tweir\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_voluntary_switches(status), Some(1234));
        assert_eq!(parse_voluntary_switches("Name:\tweir\n"), None);
        use std::os::unix::process::CommandExt;
        // A group of its own: this test process's threads (other tests) come and go, and a
        // thread that exits takes its switches out of the sum. The shell waits for a child
        // `sleep` ten times in 100 ms, each wait a voluntary switch, and stays alive.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do sleep 0.01; done"])
            .process_group(0)
            .spawn()
            .expect("sh");
        let group = i32::try_from(child.id()).expect("pid");
        // The sum is not monotonic: each `sleep` child takes its own switches with it when it
        // exits. So the test keeps the highest sum it saw, not a last read after the loop.
        let before = group_sleeps(group);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut after = before;
        while after <= before + 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            after = after.max(group_sleeps(group));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(after > before + 5, "{before} -> {after}");
    }

    #[test]
    fn parses_vm_hwm() {
        let status =
            "Name:\tnginx\nVmPeak:\t   13520 kB\nVmHWM:\t    6056 kB\nVmRSS:\t    6000 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(6056));
        assert_eq!(parse_vm_hwm_kib("Name:\tx\n"), None);
    }

    #[test]
    fn parses_proc_stat_cpu_lines() {
        let stat = "cpu  10 0 20 300 4 0 5 0 0 0\n\
                    cpu0 6 1 12 150 2 0 3 0 0 0\n\
                    cpu1 4 0 8 150 2 0 2 0 0 0\n\
                    intr 12345\n";
        let c0 = parse_proc_stat_cpu(stat, 0).unwrap();
        assert_eq!(c0.user, 6);
        assert_eq!(c0.softirq, 3);
        assert_eq!(c0.task_ticks(), 19);
        let c1 = parse_proc_stat_cpu(stat, 1).unwrap();
        assert_eq!(c1.idle, 150);
        assert!(parse_proc_stat_cpu(stat, 2).is_none());
        // "cpu1" must not match "cpu10".
        assert!(parse_proc_stat_cpu("cpu10 1 2 3 4\n", 1).is_none());
    }

    #[test]
    fn reads_own_group() {
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        assert!(group_members(pgid)
            .iter()
            .any(|p| p.pid == std::process::id() as i32));
        assert!(group_peak_rss_kib(pgid).unwrap_or(0) > 0);
        assert!(cpu_times(0).is_some());
    }
}
