//! Request ids (`request_id` of a listener): every request gets one, sent upstream in the
//! listener's header, offered to header templates as `{request_id}` and written to the
//! JSON access log.
//!
//! A client's id is kept when the listener trusts it and it is well formed: exactly one
//! header line whose value is 1 to 128 bytes of `[A-Za-z0-9._-]` (UUIDs, ULIDs and most
//! tracing ids; nothing that could break a log line or a header). Otherwise Weir makes one:
//! a random per-worker prefix and a per-worker counter, both 16 hex digits
//! (`3f9a1c0e5b7d2a41-000000000000002a`). No lock, no syscall, no allocation per request;
//! ids are unique per process run, not secret.

use std::cell::RefCell;
use std::hash::{BuildHasher, RandomState};

use weir_config::RequestIdSettings;

use crate::codec::http1::RequestHead;

/// The longest id kept from a client (and the buffer size).
pub const MAX_LEN: usize = 128;

/// One request's id, in a fixed buffer reused across the connection's requests.
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; MAX_LEN],
    len: u8,
}

impl Default for RequestId {
    fn default() -> RequestId {
        RequestId {
            bytes: [0; MAX_LEN],
            len: 0,
        }
    }
}

impl RequestId {
    /// The id; empty when the listener has `request_id = false`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    fn set(&mut self, value: &[u8]) {
        self.bytes[..value.len()].copy_from_slice(value);
        self.len = value.len() as u8;
    }
}

/// How long a generated id is: 16 hex digits of prefix, `-`, 16 of counter.
const ID_LEN: usize = 33;

/// A worker's id source: a random prefix fixed at start and a counter, kept as the text of
/// the last id made, so that the next one is that text with its counter incremented in
/// place (usually its last digit alone) instead of all 16 digits written again.
pub struct RequestIds {
    last: RefCell<[u8; ID_LEN]>,
}

impl Default for RequestIds {
    fn default() -> RequestIds {
        // RandomState is seeded from the OS once per thread: a different prefix per worker
        // and per run, read once.
        let seed = RandomState::new().hash_one(std::time::SystemTime::now());
        let mut last = [b'0'; ID_LEN];
        let mut prefix = [0u8; 16];
        hex16(seed, &mut prefix);
        last[..16].copy_from_slice(&prefix);
        last[16] = b'-';
        RequestIds {
            last: RefCell::new(last),
        }
    }
}

impl RequestIds {
    /// Writes the next id into `id`.
    pub fn next(&self, id: &mut RequestId) {
        let mut last = self.last.borrow_mut();
        increment_hex(&mut last[17..]);
        id.bytes[..ID_LEN].copy_from_slice(&*last);
        id.len = ID_LEN as u8;
    }
}

/// Adds one to the lower-case hex number `digits` (most significant first), wrapping
/// to zero.
fn increment_hex(digits: &mut [u8]) {
    for d in digits.iter_mut().rev() {
        match *d {
            b'9' => {
                *d = b'a';
                return;
            }
            b'f' => *d = b'0',
            _ => {
                *d += 1;
                return;
            }
        }
    }
}

fn hex16(mut n: u64, out: &mut [u8; 16]) {
    for slot in out.iter_mut().rev() {
        *slot = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
    }
}

/// Whether a client's id may be kept as it is.
pub fn well_formed(value: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&value.len())
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Sets `id` for the request `head` (parsed from `buf`): the client's when trusted and
/// well formed, else a new one.
pub fn assign(
    id: &mut RequestId,
    ids: &RequestIds,
    settings: &RequestIdSettings,
    buf: &[u8],
    head: &RequestHead,
) {
    if settings.trust_client {
        if let Some(value) = only_line(buf, head, settings.header.as_bytes()) {
            if well_formed(value) {
                id.set(value);
                return;
            }
        }
    }
    ids.next(id);
}

/// The value of the one field line named `name` (ASCII case-insensitively) in `head`;
/// `None` when there is none or more than one. One plain loop: written as two `next()`s
/// of a filtering iterator, it became two calls of a non-inlined slice `find` (about 60
/// instructions per request, most requests having no such line at all).
#[inline]
fn only_line<'b>(buf: &'b [u8], head: &RequestHead, name: &[u8]) -> Option<&'b [u8]> {
    let mut found = None;
    for h in &head.headers {
        if h.name.len() == name.len() && buf[h.name.clone()].eq_ignore_ascii_case(name) {
            if found.is_some() {
                return None;
            }
            found = Some(h.value.clone());
        }
    }
    found.map(|value| &buf[value])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_well_formed_and_distinct() {
        let ids = RequestIds::default();
        let (mut a, mut b) = (RequestId::default(), RequestId::default());
        ids.next(&mut a);
        ids.next(&mut b);
        assert!(well_formed(a.as_bytes()) && well_formed(b.as_bytes()));
        assert_eq!(a.as_bytes().len(), 33);
        assert_ne!(a.as_bytes(), b.as_bytes());
        assert_eq!(a.as_bytes()[..17], b.as_bytes()[..17]);
        assert!(b.as_bytes().ends_with(b"-0000000000000002"));
        let other = RequestIds::default();
        assert_ne!(
            other.last.borrow()[..16],
            ids.last.borrow()[..16],
            "each worker has its own prefix"
        );
    }

    #[test]
    fn well_formed_is_short_and_plain() {
        assert!(well_formed(b"a"));
        assert!(well_formed(b"0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(well_formed(&[b'x'; 128]));
        assert!(!well_formed(&[b'x'; 129]));
        assert!(!well_formed(b""));
        for bad in [&b"a b"[..], b"a\"b", b"a,b", b"a/b", b"\xc3\xa9"] {
            assert!(!well_formed(bad), "{bad:?}");
        }
    }

    /// The id `assign` gives the request `raw` under the default settings.
    fn assigned(raw: &[u8]) -> Vec<u8> {
        let limits = crate::codec::http1::HeadLimits {
            max_header_size: 4096,
            max_headers: 16,
        };
        let mut head = RequestHead::default();
        assert!(crate::codec::http1::parse_request(raw, limits, &mut head).unwrap());
        let mut id = RequestId::default();
        let settings = RequestIdSettings::default();
        assign(&mut id, &RequestIds::default(), &settings, raw, &head);
        id.as_bytes().to_vec()
    }

    #[test]
    fn a_client_id_is_kept_only_from_exactly_one_well_formed_line() {
        let one = b"GET / HTTP/1.1\r\nHost: h\r\nx-request-ID: abc-1\r\nA: b\r\n\r\n";
        assert_eq!(assigned(one), b"abc-1");
        let two = b"GET / HTTP/1.1\r\nX-Request-Id: a\r\nHost: h\r\nX-Request-Id: a\r\n\r\n";
        let bad = b"GET / HTTP/1.1\r\nHost: h\r\nX-Request-Id: a/b\r\n\r\n";
        let none = b"GET / HTTP/1.1\r\nHost: h\r\nX-Request-Ie: abc\r\n\r\n";
        for raw in [&two[..], bad, none] {
            assert_eq!(
                assigned(raw).len(),
                ID_LEN,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn the_counter_counts_in_hex_and_wraps() {
        let mut n = *b"00000000000000ff";
        increment_hex(&mut n);
        assert_eq!(&n, b"0000000000000100");
        for (from, to) in [
            (0u64, 1u64),
            (9, 10),
            (0xf, 0x10),
            (0x9ff, 0xa00),
            (u64::MAX, 0),
        ] {
            let mut digits = [0u8; 16];
            hex16(from, &mut digits);
            increment_hex(&mut digits);
            let mut want = [0u8; 16];
            hex16(to, &mut want);
            assert_eq!(digits, want, "{from:x} + 1");
        }
    }
}
