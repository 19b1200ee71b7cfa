//! The environment record printed with every result: date, CPU, cores, kernel, OS, the
//! versions of the peers and tools, and the Weir commit.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Env {
    pub date_utc: String,
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub os: String,
    pub weir_commit: String,
    /// (tool, version line) for each peer and load tool found.
    pub versions: Vec<(String, String)>,
}

/// Collects the record; `weir` is the binary under test, `repo` the workspace root.
pub fn collect(weir: &Path, repo: &Path) -> Env {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let mut versions = Vec::new();
    let weir_s = weir.to_string_lossy().into_owned();
    let probes: [(&str, &str, &[&str]); 8] = [
        ("weir", &weir_s, &["--version"]),
        ("nginx", "nginx", &["-v"]),
        ("haproxy", "haproxy", &["-v"]),
        ("caddy", "caddy", &["version"]),
        ("apache", "apache2", &["-v"]),
        ("wrk", "wrk", &["-v"]),
        ("ab", "ab", &["-V"]),
        ("taskset", "taskset", &["--version"]),
    ];
    for (name, prog, args) in probes {
        let path = if prog.contains('/') {
            Some(prog.into())
        } else {
            crate::process::find_program(prog)
        };
        if let Some(v) = path.and_then(|p| version_line(&p, args)) {
            versions.push((name.to_string(), v));
        }
    }
    Env {
        date_utc: utc_now(),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            .unwrap_or_else(|| "unknown".into()),
        // Online CPUs of the machine (the harness itself is pinned to one).
        // SAFETY: sysconf has no preconditions.
        cores: unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        os: os_release
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| "unknown".into()),
        weir_commit: git_commit(repo),
        versions,
    }
}

fn version_line(prog: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(prog).args(args).output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    first_version_line(&text)
}

/// The first line that carries a version number.
pub fn first_version_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| l.chars().any(|c| c.is_ascii_digit()) && !l.is_empty())
        .map(|l| l.chars().take(100).collect())
}

fn git_commit(repo: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c} (with uncommitted changes)")
            } else {
                c
            }
        }
        None => "unknown".into(),
    }
}

fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the epoch (days-to-civil, proleptic Gregorian).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13 UTC");
    }

    #[test]
    fn picks_version_lines() {
        assert_eq!(
            first_version_line("nginx version: nginx/1.22.1\n").unwrap(),
            "nginx version: nginx/1.22.1"
        );
        assert_eq!(
            first_version_line("\nUsage: x\nHAProxy version 2.6.12 2023/04/01\n").unwrap(),
            "HAProxy version 2.6.12 2023/04/01"
        );
        assert!(first_version_line("no digits here").is_none());
    }
}
