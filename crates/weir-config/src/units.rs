//! Durations and sizes as written in the configuration.
//!
//! Both are a non-negative integer followed by an optional unit, with optional whitespace
//! in between: `"250ms"`, `"5 s"`, `"16KiB"`, `"10MB"`. Fractions are not accepted.
//! Arithmetic is checked: a value too large to represent is an error, never a panic.

use std::time::Duration;

/// What a duration may look like; ends every duration error.
const DURATION_HINT: &str = r#"expected a duration such as "250ms", "5s", "2m", "1h" or "7d""#;

/// What a size may look like; ends every size error.
const SIZE_HINT: &str =
    r#"expected a size such as "0", "512B", "16KiB", "64k", "10MB" or "1GiB" (k/m/g are binary)"#;

/// The longest duration accepted (ten years): every timeout is added to the current time
/// on the request path, and a sum past what the clock can hold would abort the process.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses a duration: an integer and a unit out of `ms`, `s`, `m`, `h`, `d`, at most
/// [`MAX_DURATION`].
///
/// The unit may be left out only for zero (`"0"`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let too_large =
        || format!("duration \"{text}\" is too large (at most 87600h or 3650d, ten years)");
    parse_unbounded_duration(text)?
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(too_large)
}

/// A duration of any size; `Ok(None)` when it does not fit in a `Duration`.
fn parse_unbounded_duration(text: &str) -> Result<Option<Duration>, String> {
    let (number, unit) = split_number(text)
        .ok_or_else(|| format!("invalid duration \"{text}\": {DURATION_HINT}"))?;
    let Ok(value) = number.parse::<u64>() else {
        return Ok(None);
    };
    let secs = |factor: u64| Ok(value.checked_mul(factor).map(Duration::from_secs));
    if let Some(fraction) = unit.strip_prefix('.') {
        return Err(fraction_error(text, value, fraction));
    }
    match unit {
        "ms" => Ok(Some(Duration::from_millis(value))),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(24 * 3600),
        "" if value == 0 => Ok(Some(Duration::ZERO)),
        "" => Err(format!("duration \"{text}\" has no unit: {DURATION_HINT}")),
        _ => Err(format!(
            "unknown duration unit \"{unit}\" in \"{text}\": {DURATION_HINT}"
        )),
    }
}

/// `"1.5s"`: fractions are not accepted; say so, with the whole number of the next
/// smaller unit when there is one (`"1500ms"`).
fn fraction_error(text: &str, whole: u64, fraction: &str) -> String {
    let digits: String = fraction.chars().take_while(char::is_ascii_digit).collect();
    let unit = fraction[digits.len()..].trim();
    let smaller = match unit {
        "s" => Some(("ms", 1000)),
        "m" => Some(("s", 60)),
        "h" => Some(("m", 60)),
        "d" => Some(("h", 24)),
        _ => None,
    };
    let exact = smaller.and_then(|(name, factor): (&str, u64)| {
        let scale = 10u64.checked_pow(u32::try_from(digits.len()).ok()?)?;
        let frac: u64 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let total = whole
            .checked_mul(scale)?
            .checked_add(frac)?
            .checked_mul(factor)?;
        (total % scale == 0).then(|| format!("\"{}{name}\"", total / scale))
    });
    let instead = exact.map_or_else(
        || "a whole number of a smaller unit".to_owned(),
        |v| format!("{v} instead"),
    );
    format!("duration \"{text}\" has a fraction, which is not accepted: write {instead}; {DURATION_HINT}")
}

/// Parses a size in bytes: an integer and an optional unit.
///
/// Units: `B`; decimal `KB`, `MB`, `GB`; binary `KiB`, `MiB`, `GiB` and their short forms
/// `k`, `m`, `g`. No unit means bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (number, unit) =
        split_number(text).ok_or_else(|| format!("invalid size \"{text}\": {SIZE_HINT}"))?;
    let too_large = || format!("size \"{text}\" is too large");
    let value: u64 = number.parse().map_err(|_| too_large())?;
    let factor: u64 = match unit {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" | "k" => 1 << 10,
        "MiB" | "m" => 1 << 20,
        "GiB" | "g" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown size unit \"{unit}\" in \"{text}\": {SIZE_HINT}"
            ))
        }
    };
    value.checked_mul(factor).ok_or_else(too_large)
}

/// Splits `"  12 ms "` into `("12", "ms")`; `None` unless it starts with an ASCII digit.
fn split_number(text: &str) -> Option<(&str, &str)> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (number, unit) = text.split_at(digits);
    Some((number, unit.trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 5 s "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn bad_durations() {
        for text in [
            "", "s", "5", "5x", "5 sec", "-5s", "1.5s", "5S", "+5s", "5s5", "1D", "1day",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains(DURATION_HINT), "{text}: {err}");
        }
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unit \"x\""));
        // Was: `unknown duration unit ".5s"`.
        let e = parse_duration("1.5s").unwrap_err();
        assert!(
            e.contains("has a fraction") && e.contains("\"1500ms\" instead"),
            "{e}"
        );
        assert!(parse_duration("2.5m")
            .unwrap_err()
            .contains("\"150s\" instead"));
        assert!(parse_duration("0.3333s")
            .unwrap_err()
            .contains("a smaller unit"));
        assert!(parse_duration("1.5ms")
            .unwrap_err()
            .contains("a smaller unit"));
    }

    #[test]
    fn duration_overflow_is_an_error() {
        let max = u64::MAX;
        assert_eq!(parse_duration("87600h"), Ok(MAX_DURATION));
        for text in [
            "87601h".to_owned(),
            format!("{}s", MAX_DURATION.as_secs() + 1),
            format!("{max}s"),
            format!("{max}ms"),
            format!("{max}m"),
            format!("{max}h"),
            format!("{max}d"),
            "3651d".to_owned(),
            "99999999999999999999999s".to_owned(),
        ] {
            assert!(
                parse_duration(&text).unwrap_err().contains("too large"),
                "{text}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("1KB"), Ok(1_000));
        assert_eq!(parse_size("1KiB"), Ok(1_024));
        assert_eq!(parse_size("16KiB"), Ok(16_384));
        assert_eq!(parse_size("16k"), Ok(16_384));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("3GiB"), Ok(3 << 30));
        assert_eq!(parse_size("3g"), Ok(3 << 30));
        assert_eq!(parse_size(" 10 MiB "), Ok(10 << 20));
    }

    #[test]
    fn bad_sizes() {
        for text in ["", "KiB", "1.5k", "-1", "1kb", "1K", "1 KiBs", "1TB", "x1"] {
            let err = parse_size(text).expect_err(text);
            assert!(err.contains(SIZE_HINT), "{text}: {err}");
        }
    }

    #[test]
    fn size_overflow_is_an_error() {
        let max = u64::MAX;
        assert_eq!(parse_size(&max.to_string()), Ok(max));
        for text in [
            format!("{max}k"),
            "17179869184GiB".to_owned(),
            "99999999999999999999".to_owned(),
        ] {
            assert!(
                parse_size(&text).unwrap_err().contains("too large"),
                "{text}"
            );
        }
    }
}
