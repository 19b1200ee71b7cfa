//! Timestamps for log lines without a date crate: civil date from Unix days (the
//! well-known days-to-civil algorithm), cached per second.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// A UTC time broken into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl Civil {
    pub fn from_unix(secs: u64) -> Civil {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Civil {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// `22/Nov/2026:07:40:38 +0000` (common log format).
    pub fn common(&self) -> String {
        let month = MONTHS[(self.month as usize).saturating_sub(1).min(11)];
        format!(
            "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
            self.day, month, self.year, self.hour, self.minute, self.second
        )
    }

    /// `2026-11-22T07:40:38` (ISO 8601, the caller adds fractions and `Z`).
    pub fn iso(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// The formatted current second, recomputed only when the second changes.
#[derive(Debug, Default)]
pub struct TimeCache {
    second: u64,
    common: String,
    iso: String,
}

impl TimeCache {
    /// (common form, ISO form, milliseconds within the second) for now.
    pub fn now(&mut self) -> (&str, &str, u32) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if now.as_secs() != self.second || self.common.is_empty() {
            let civil = Civil::from_unix(now.as_secs());
            self.second = now.as_secs();
            self.common = civil.common();
            self.iso = civil.iso();
        }
        (&self.common, &self.iso, now.subsec_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(Civil::from_unix(0).iso(), "1970-01-01T00:00:00");
        assert_eq!(Civil::from_unix(951_782_400).iso(), "2000-02-29T00:00:00");
        assert_eq!(
            Civil::from_unix(1_795_333_238).common(),
            "22/Nov/2026:07:40:38 +0000"
        );
        assert_eq!(Civil::from_unix(4_102_444_799).iso(), "2099-12-31T23:59:59");
    }
}
