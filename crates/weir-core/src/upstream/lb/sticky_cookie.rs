//! Sticky sessions by cookie: the response of a request that had no valid cookie sets one
//! naming the server (by an opaque id, not its address); later requests carrying it go to
//! that server while it is available. Without a usable cookie the pool's smooth weighted
//! round robin chooses, and the response sets the cookie.

use super::consistent_hash::Fnv;

/// The opaque id of a server in the cookie: a hash of the upstream's and server's names.
pub fn server_id(upstream: &str, server: &str) -> u64 {
    let mut h = Fnv::new();
    h.write(upstream.as_bytes());
    h.write(b"/");
    h.write(server.as_bytes());
    h.finish()
}

/// The `Set-Cookie` header line (with CRLF) pinning a client to the server `id`.
pub fn set_cookie_line(cookie: &str, id: u64) -> Box<[u8]> {
    format!("Set-Cookie: {cookie}={id:016x}; Path=/; HttpOnly\r\n")
        .into_bytes()
        .into_boxed_slice()
}

/// Parses a cookie value written by [`set_cookie_line`].
pub fn parse_id(value: &[u8]) -> Option<u64> {
    if value.len() != 16 {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// The member whose id is `id`.
pub fn member_of(ids: &[u64], id: u64) -> Option<usize> {
    ids.iter().position(|&i| i == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_the_cookie() {
        let ids: Vec<u64> = ["10.0.0.1:80", "10.0.0.2:80"]
            .iter()
            .map(|s| server_id("app", s))
            .collect();
        assert_ne!(ids[0], ids[1]);
        let line = set_cookie_line("weir_server", ids[1]);
        let text = std::str::from_utf8(&line).unwrap();
        assert!(text.starts_with("Set-Cookie: weir_server="), "{text}");
        assert!(text.ends_with("; Path=/; HttpOnly\r\n"), "{text}");
        let value = &text["Set-Cookie: weir_server=".len()..][..16];
        assert_eq!(
            member_of(&ids, parse_id(value.as_bytes()).unwrap()),
            Some(1)
        );
        assert_eq!(parse_id(b"zz"), None);
        assert_eq!(parse_id(b"xyz0000000000000"), None);
        assert_eq!(member_of(&ids, 5), None);
    }
}
