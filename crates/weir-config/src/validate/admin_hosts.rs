//! `[admin] allowed_hosts`: the names (and addresses) an operator reaches the admin API by,
//! accepted in `Host` and `Origin` besides the listener's own address (see
//! `weir-admin`'s `api::guard`). Stored lower-cased; an IP address as `IpAddr` displays it
//! (IPv6 without brackets), so the guard compares text with text.

use std::net::IpAddr;

use crate::error::{FieldPath, Issue};

/// Validates every entry; the first bad one is the error, at its index.
pub(super) fn allowed_hosts(
    raw: Option<Vec<String>>,
    path: &FieldPath,
) -> Result<Vec<String>, Issue> {
    raw.unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, text)| {
            entry(text).map_err(|(message, fix)| Issue::new(&path.index(i), message, fix))
        })
        .collect()
}

/// One entry: an IP address (IPv6 with or without brackets) or a host name, without a
/// port; an error is `(message, fix)`.
fn entry(text: &str) -> Result<String, (String, String)> {
    let err = |message: String, fix: &str| Err((message, fix.to_owned()));
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
    if let Ok(ip) = bare.unwrap_or(text).parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    if text.contains('*') {
        return err(
            format!("allowed_hosts entry \"{text}\": wildcards are not accepted"),
            "list each name the admin API is reached by (a wildcard would let any \
             rebinding domain under it through)",
        );
    }
    if text.contains(':') {
        return err(
            format!("allowed_hosts entry \"{text}\" includes a port; the port is not checked"),
            "write the host name or address alone, such as \"weir-admin.internal\"",
        );
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if text.len() > 253 || !text.split('.').all(label_ok) {
        return err(
            format!("allowed_hosts entry \"{text}\" is not a valid host name"),
            "use labels of letters, digits, '-' and '_' separated by single dots \
             (internationalized names in punycode, xn--...), or an IP address",
        );
    }
    Ok(text.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::entry;

    #[test]
    fn names_and_addresses_are_normalised_and_bad_entries_refused() {
        assert_eq!(
            entry("Weir-Admin.Internal"),
            Ok("weir-admin.internal".into())
        );
        assert_eq!(entry("10.0.0.5"), Ok("10.0.0.5".into()));
        assert_eq!(entry("[::1]"), Ok("::1".into()));
        assert_eq!(entry("2001:DB8::1"), Ok("2001:db8::1".into()));
        for bad in [
            "",
            "*",
            "*.example.com",
            "admin:9901",
            "a..b",
            "a b",
            "é.com",
            "x.",
        ] {
            assert!(entry(bad).is_err(), "{bad:?}");
        }
    }
}
