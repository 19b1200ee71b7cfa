//! What an accept loop does when accept(2) fails for lack of resources (EMFILE, ENFILE,
//! ENOBUFS, ENOMEM): the listening socket stays readable, so retrying at once spins a core
//! without making progress. Both the data-plane and the admin accept loops pause for
//! [`RESOURCE_BACKOFF`] instead, and log at most one line a second.

use std::io;
use std::time::{Duration, Instant};

/// How long to pause accepting after a resource error.
pub const RESOURCE_BACKOFF: Duration = Duration::from_millis(50);
/// At most one resource-error log line per accept loop per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Whether an accept error means the process or system is out of descriptors or memory
/// (pause and retry) rather than a problem with one connection (go on at once).
pub fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Rate limit for one accept loop's resource-error log lines.
#[derive(Debug, Default)]
pub struct ResourceLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl ResourceLog {
    /// Counts one error; returns `Some(errors left unlogged since the last line)` when this
    /// one should be logged.
    pub fn should_log(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < LOG_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_errors_are_told_apart() {
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(code)));
        }
        for code in [libc::ECONNABORTED, libc::EINTR, libc::EPERM] {
            assert!(!is_resource_exhaustion(&io::Error::from_raw_os_error(code)));
        }
    }

    #[test]
    fn logs_once_per_interval_and_counts_the_rest() {
        let mut log = ResourceLog::default();
        assert_eq!(log.should_log(), Some(0));
        assert_eq!(log.should_log(), None);
        assert_eq!(log.should_log(), None);
        log.last = Instant::now().checked_sub(LOG_INTERVAL);
        assert_eq!(log.should_log(), Some(2));
    }
}
