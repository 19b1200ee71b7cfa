//! Validation of a listener's `path_normalization` table, and of its routes' `path_prefix`
//! against it: requests are routed on their normalised path, so a prefix that is not itself
//! in normal form (`/a/./b/`, `/%7Euser/`, `/a//b/` with `merge_slashes`) could never match.

use crate::error::{FieldPath, Issue};
use crate::model::{EncodedSlash, PathNormalization};
use crate::raw::RawPathNormalization;

/// `[listeners.path_normalization]`: every key optional, safe defaults.
pub(super) fn path_normalization(
    raw: Option<RawPathNormalization>,
    path: &FieldPath,
) -> Result<PathNormalization, Issue> {
    let Some(raw) = raw else {
        return Ok(PathNormalization::default());
    };
    let defaults = PathNormalization::default();
    let encoded_slash = match raw.encoded_slash.as_deref() {
        None => defaults.encoded_slash,
        Some("reject") => EncodedSlash::Reject,
        Some("keep") => EncodedSlash::Keep,
        Some("decode") => EncodedSlash::Decode,
        Some(other) => {
            return Err(Issue::new(
                &path.key("encoded_slash"),
                format!("unknown encoded_slash value \"{other}\""),
                r#"use encoded_slash = "reject" (the default), "keep" or "decode""#,
            ))
        }
    };
    Ok(PathNormalization {
        dot_segments: raw.dot_segments.unwrap_or(defaults.dot_segments),
        merge_slashes: raw.merge_slashes.unwrap_or(defaults.merge_slashes),
        encoded_slash,
    })
}

/// A `path_prefix` must be in the normal form requests are matched in.
pub(super) fn check_prefix(
    prefix: &str,
    settings: &PathNormalization,
    path: &FieldPath,
) -> Result<(), Issue> {
    if settings.is_off() {
        return Ok(());
    }
    match prefix_problem(prefix.as_bytes(), settings) {
        None => Ok(()),
        Some((problem, fix)) => Err(Issue::new(
            path,
            format!(
                "path_prefix \"{prefix}\" {problem}: requests are routed on their normalised \
                 path (see path_normalization), so this route could never match"
            ),
            fix,
        )),
    }
}

/// What keeps `prefix` from being a normalised path, and how to write it instead.
fn prefix_problem(prefix: &[u8], s: &PathNormalization) -> Option<(String, String)> {
    let slashes_special = s.encoded_slash != EncodedSlash::Keep;
    for (i, &b) in prefix.iter().enumerate() {
        if b == b'\\' && slashes_special {
            return Some((
                "contains '\\'".into(),
                "remove the backslash, or set encoded_slash = \"keep\"".into(),
            ));
        }
        if b == b'%' {
            if let Some(problem) = escape_problem(&prefix[i..], s) {
                return Some(problem);
            }
        }
    }
    // A dot segment, also with parameters (`..;x`, refused in requests).
    let is_dot = |seg: &[u8]| matches!(seg.split(|b| *b == b';').next(), Some(b"." | b".."));
    if s.dot_segments && prefix.split(|b| *b == b'/').skip(1).any(is_dot) {
        let fix = "write the prefix without \".\" and \"..\" segments";
        return Some(("contains a dot segment".into(), fix.into()));
    }
    if s.merge_slashes && prefix.windows(2).any(|w| w == b"//") {
        let fix = "write single slashes, or set merge_slashes = false";
        return Some(("contains \"//\"".into(), fix.into()));
    }
    None
}

/// The problem with the escape at the start of `rest` (`%..`), if any.
fn escape_problem(rest: &[u8], s: &PathNormalization) -> Option<(String, String)> {
    let escape = String::from_utf8_lossy(&rest[..rest.len().min(3)]).into_owned();
    let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
    let (Some(high), Some(low)) = (hex(rest.get(1)), hex(rest.get(2))) else {
        let fix = "percent-encode '%' itself as %25";
        return Some((format!("has a malformed escape \"{escape}\""), fix.into()));
    };
    let value = (high * 16 + low) as u8;
    let unreserved = value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~');
    if unreserved {
        let fix = format!("write '{}' instead of {escape}", char::from(value));
        return Some((format!("encodes '{}'", char::from(value)), fix));
    }
    match s.encoded_slash {
        _ if !matches!(value, b'/' | b'\\') => {}
        EncodedSlash::Keep => {}
        EncodedSlash::Reject => {
            return Some((
                format!("contains {escape}, which encoded_slash = \"reject\" refuses"),
                "remove it, or set encoded_slash = \"keep\"".into(),
            ))
        }
        EncodedSlash::Decode => {
            return Some((
                format!("contains {escape}, which encoded_slash = \"decode\" turns into '/'"),
                format!("write '/' instead of {escape}"),
            ))
        }
    }
    if rest[1..3].iter().any(u8::is_ascii_lowercase) {
        let fix = format!("write {} in upper case", escape.to_ascii_uppercase());
        return Some((format!("has the lower-case escape {escape}"), fix));
    }
    None
}
