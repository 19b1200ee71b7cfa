//! `process_*` metrics read from /proc (Linux), as the Prometheus client libraries name them.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A point-in-time reading of this process's resources.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// Reads the current values; fields that cannot be read stay 0.
    pub fn read() -> ProcessStats {
        let mut stats = ProcessStats::default();
        let ticks = clock_ticks();
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            if let Some(fields) = stat_fields(&stat) {
                let field = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                // Fields after "(comm)": utime is the 14th field overall, i.e. index 11 here.
                stats.cpu_seconds = (field(11) + field(12)) as f64 / ticks;
                stats.resident_bytes = field(21) * page_size();
                stats.start_time_seconds = boot_time() + field(19) as f64 / ticks;
            }
        }
        stats.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        stats.max_fds = max_open_files();
        stats
    }
}

/// The fields after the `(comm)` field, which may itself contain spaces.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

/// Clock ticks per second, the unit of the CPU times in /proc/self/stat (100 on most
/// Linux systems, but a kernel setting: read it, as the Prometheus clients do).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| crate::sys::clock_ticks_per_second().unwrap_or(100)) as f64
}

/// The page size, the unit of the resident set in /proc/self/stat: 4 KiB on x86-64, but
/// 16 or 64 KiB on some arm64 and ppc64 kernels.
fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| crate::sys::page_size().unwrap_or(4096))
}

fn boot_time() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
    };
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn max_open_files() -> u64 {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else {
        return 0;
    };
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes > 0);
        assert!(s.open_fds > 0);
        assert!(s.max_fds >= s.open_fds);
        assert!(s.start_time_seconds > 1.0e9);
    }

    /// The resident set from /proc/self/stat (pages times the page size) agrees with the
    /// kernel's own byte count, VmRSS in /proc/self/status. Both move while the test
    /// harness runs other threads, hence the generous factor; a wrong page size (4 KiB
    /// assumed on a 64 KiB kernel) is off by 16.
    #[test]
    fn resident_bytes_match_vm_rss() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let vm_rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        let resident = ProcessStats::read().resident_bytes;
        let vm_rss = vm_rss_kib * 1024;
        assert!(
            resident >= vm_rss / 2 && resident <= vm_rss * 2,
            "resident {resident} bytes vs VmRSS {vm_rss} bytes"
        );
    }

    #[test]
    fn units_come_from_the_system() {
        let page = page_size();
        assert!(page.is_power_of_two() && page >= 4096, "{page}");
        let ticks = clock_ticks();
        assert!((1.0..=10_000.0).contains(&ticks), "{ticks}");
    }

    #[test]
    fn comm_with_spaces() {
        let fields = stat_fields("42 (a b) S 1 2 3").unwrap();
        assert_eq!(fields, vec!["S", "1", "2", "3"]);
    }
}
