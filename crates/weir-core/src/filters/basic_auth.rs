//! HTTP Basic authentication (`basic_auth = { users_file, realm }` of a route).
//!
//! The credentials of `Authorization: Basic ...` are decoded on the stack and checked
//! against the route's htpasswd entries (bcrypt or argon2). Both are slow on purpose
//! (milliseconds per check), so each worker remembers the last successful checks in a small fixed cache,
//! keyed by a 128-bit keyed hash of (user, password, stored hash): a client sending the
//! same credentials again costs two SipHash runs, not a bcrypt. A changed or removed entry
//! (after a reload) no longer matches its cache line. Failed checks are not cached: put a
//! `rate_limit` on routes exposed to password guessing.
//!
//! A check the cache cannot answer is never run on the worker's event loop (a bcrypt of
//! cost 10 takes tens of milliseconds, and every other request of the worker would wait):
//! [`authorized`] says [`Check::Verify`], and the caller awaits [`PendingCheck::run`] on
//! tokio's blocking pool. At most `[server] password_checks` (default 4) run at once in the
//! process, so a flood of guesses cannot take the pool; past that a request is answered 503
//! with `Retry-After`
//! at once (not queued: a queue would hold each guesser's connection and grow with the
//! flood). A user the file does not name is checked too, against another entry's hash
//! (same algorithm and cost) and refused whatever the result, so that the time taken does
//! not tell which users exist.

use std::cell::{Cell, RefCell};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};

use weir_config::BasicAuth;

use crate::codec::http1::header::trim;
use crate::codec::http1::{HeaderSpan, RequestHead};

/// Successful checks remembered per worker.
const CACHE_LINES: usize = 64;

/// The longest decoded `user:password` accepted (longer: refused).
const MAX_CREDENTIALS: usize = 512;

/// Password checks running now in the process (on tokio's blocking pool). A counter, not a
/// semaphore, so that a reload changing `[server] password_checks` needs no resizing: each
/// check compares with the limit of the config it was routed by.
static CHECKS: AtomicUsize = AtomicUsize::new(0);

/// One of the [`CHECKS`] under way, given back when dropped.
struct CheckSlot;

impl CheckSlot {
    /// A slot, unless `limit` checks are under way already.
    fn take(limit: usize) -> Option<CheckSlot> {
        CHECKS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| CheckSlot)
    }
}

impl Drop for CheckSlot {
    fn drop(&mut self) {
        CHECKS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the credentials of a request come to.
pub enum Check {
    Admitted,
    Refused,
    /// A password hash must be verified first (off the event loop).
    Verify(Box<PendingCheck>),
}

/// A password to verify against a stored hash, owned so that it can go to another thread.
pub struct PendingCheck {
    password: Vec<u8>,
    hash: String,
    /// The cache line a success fills; `None`: an unknown user, refused whatever the hash
    /// says.
    fingerprint: Option<(u64, u64)>,
}

/// How a [`PendingCheck`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    Refused,
    /// `[server] password_checks` checks were under way.
    Busy,
}

impl PendingCheck {
    /// Verifies the password on the blocking pool (a success goes into `cache`), unless
    /// `limit` checks are under way in the process.
    pub async fn run(self, cache: &AuthCache, limit: usize) -> Verdict {
        let Some(slot) = CheckSlot::take(limit) else {
            return Verdict::Busy;
        };
        let PendingCheck {
            password,
            hash,
            fingerprint,
        } = self;
        let job = tokio::task::spawn_blocking(move || {
            let ok = verify(&password, &hash);
            drop(slot);
            ok
        });
        match (job.await, fingerprint) {
            (Ok(true), Some(fp)) => {
                cache.insert(fp);
                Verdict::Admitted
            }
            _ => Verdict::Refused,
        }
    }
}

/// A worker's cache of recent successful checks.
pub struct AuthCache {
    keys: (RandomState, RandomState),
    lines: RefCell<[(u64, u64); CACHE_LINES]>,
    /// The next line to overwrite (round robin).
    next: Cell<usize>,
}

impl Default for AuthCache {
    fn default() -> AuthCache {
        AuthCache {
            keys: (RandomState::new(), RandomState::new()),
            lines: RefCell::new([(0, 0); CACHE_LINES]),
            next: Cell::new(0),
        }
    }
}

impl AuthCache {
    fn fingerprint(&self, user: &[u8], password: &[u8], hash: &str) -> (u64, u64) {
        let key = (user, password, hash);
        // Never (0, 0), the empty line.
        (self.keys.0.hash_one(key) | 1, self.keys.1.hash_one(key))
    }

    fn contains(&self, fp: (u64, u64)) -> bool {
        self.lines.borrow().contains(&fp)
    }

    fn insert(&self, fp: (u64, u64)) {
        let i = self.next.get();
        self.lines.borrow_mut()[i] = fp;
        self.next.set((i + 1) % CACHE_LINES);
    }
}

/// Whether the request carries credentials of a user in `auth`: known from the cache, or
/// to be verified.
pub fn authorized(auth: &BasicAuth, cache: &AuthCache, buf: &[u8], req: &RequestHead) -> Check {
    let mut decoded = [0u8; MAX_CREDENTIALS];
    let Some(credentials) = credentials(buf, &req.headers, &mut decoded) else {
        return Check::Refused;
    };
    let Some(colon) = credentials.iter().position(|b| *b == b':') else {
        return Check::Refused;
    };
    let (user, password) = (&credentials[..colon], &credentials[colon + 1..]);
    let (hash, fingerprint) = match auth.user(user) {
        Some(entry) => {
            let fp = cache.fingerprint(user, password, &entry.hash);
            if cache.contains(fp) {
                return Check::Admitted;
            }
            (&entry.hash, Some(fp))
        }
        // Unknown: the first entry's hash takes as long as a known user's would.
        None => match auth.users.first() {
            Some(decoy) => (&decoy.hash, None),
            None => return Check::Refused,
        },
    };
    Check::Verify(Box::new(PendingCheck {
        password: password.to_vec(),
        hash: hash.clone(),
        fingerprint,
    }))
}

/// Checks a password against a bcrypt or argon2 (PHC string) hash.
fn verify(password: &[u8], hash: &str) -> bool {
    use argon2::PasswordVerifier;
    if hash.starts_with("$argon2") {
        let Ok(parsed) = argon2::PasswordHash::new(hash) else {
            return false;
        };
        // The algorithm, version and costs come from the hash.
        return argon2::Argon2::default()
            .verify_password(password, &parsed)
            .is_ok();
    }
    bcrypt::verify(password, hash).unwrap_or(false)
}

/// The decoded credentials of the one `Authorization: Basic` header, in `out`.
fn credentials<'o>(buf: &[u8], headers: &[HeaderSpan], out: &'o mut [u8]) -> Option<&'o [u8]> {
    let mut lines = headers.iter().filter(|h| {
        h.name.len() == 13 && buf[h.name.clone()].eq_ignore_ascii_case(b"authorization")
    });
    let (Some(h), None) = (lines.next(), lines.next()) else {
        return None;
    };
    let value = trim(&buf[h.value.clone()]);
    let (scheme, token) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let n = decode_base64(trim(token), out)?;
    Some(&out[..n])
}

/// Standard base64 (padding optional) into `out`; `None` when invalid or too long.
fn decode_base64(text: &[u8], out: &mut [u8]) -> Option<usize> {
    let text = text
        .strip_suffix(b"==")
        .or(text.strip_suffix(b"="))
        .unwrap_or(text);
    if text.len() % 4 == 1 || text.len() / 4 * 3 + 2 > out.len() {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut n = 0;
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        let take = chunk.len() - 1;
        out[n..n + take].copy_from_slice(&bytes[1..=take]);
        n += take;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{parse_request, HeadLimits};
    use weir_config::HtUser;

    fn decode(text: &str) -> Option<Vec<u8>> {
        let mut out = [0u8; MAX_CREDENTIALS];
        decode_base64(text.as_bytes(), &mut out).map(|n| out[..n].to_vec())
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(decode("YWxpY2U6c2VjcmV0").unwrap(), b"alice:secret");
        assert_eq!(decode("YQ==").unwrap(), b"a");
        assert_eq!(decode("YWI=").unwrap(), b"ab");
        assert_eq!(decode("YWI").unwrap(), b"ab");
        assert_eq!(decode("").unwrap(), b"");
        assert!(decode("Y").is_none());
        assert!(decode("YW!=").is_none());
        assert!(decode(&"QUFB".repeat(200)).is_none(), "too long");
    }

    fn head(extra: &str) -> (String, RequestHead) {
        let raw = format!("GET / HTTP/1.1\r\nHost: a\r\n{extra}\r\n");
        let mut h = RequestHead::default();
        let limits = HeadLimits {
            max_header_size: 8192,
            max_headers: 100,
        };
        assert!(parse_request(raw.as_bytes(), limits, &mut h).unwrap());
        (raw, h)
    }

    /// What `authorized` and, when it asks for one, the password check come to; and
    /// whether a check ran.
    async fn outcome(auth: &BasicAuth, cache: &AuthCache, extra: &str) -> (bool, bool) {
        let (raw, h) = head(extra);
        match authorized(auth, cache, raw.as_bytes(), &h) {
            Check::Admitted => (true, false),
            Check::Refused => (false, false),
            Check::Verify(check) => (check.run(cache, 4).await == Verdict::Admitted, true),
        }
    }

    #[tokio::test]
    async fn checks_credentials_and_caches_successes() {
        let hash = bcrypt::hash_with_salt("secret", 4, [7u8; 16])
            .unwrap()
            .format_for_version(bcrypt::Version::TwoY);
        let auth = BasicAuth {
            realm: "r".into(),
            users_file: "x".into(),
            users: vec![HtUser {
                name: "alice".into(),
                hash: hash.clone(),
            }],
        };
        let cache = AuthCache::default();
        let check = |extra: &'static str| outcome(&auth, &cache, extra);
        assert_eq!(check("").await, (false, false));
        let wrong = check("Authorization: Basic YWxpY2U6d3Jvbmc=\r\n").await;
        assert_eq!(wrong, (false, true), "alice:wrong");
        let bearer = check("Authorization: Bearer YWxpY2U6c2VjcmV0\r\n").await;
        assert_eq!(bearer, (false, false));
        // An unknown user is checked too (against alice's hash, which "secret" matches),
        // and refused.
        let unknown = check("Authorization: Basic Ym9iOnNlY3JldA==\r\n").await;
        assert_eq!(unknown, (false, true), "bob:secret");
        assert_eq!(
            *cache.lines.borrow(),
            [(0, 0); CACHE_LINES],
            "failures not cached"
        );
        let alice = "Authorization: basic  YWxpY2U6c2VjcmV0\r\n";
        assert_eq!(check(alice).await, (true, true), "alice:secret");
        let fp = cache.fingerprint(b"alice", b"secret", &hash);
        assert!(cache.contains(fp));
        assert_eq!(check(alice).await, (true, false), "from the cache");
        // Two Authorization headers: refused.
        let twice =
            "Authorization: Basic YWxpY2U6c2VjcmV0\r\nAuthorization: Basic YWxpY2U6c2VjcmV0\r\n";
        assert_eq!(check(twice).await, (false, false));
        // A cache hit does not depend on bcrypt: the same fingerprint under another hash
        // string (a changed entry) is a different line.
        assert!(!cache.contains(cache.fingerprint(b"alice", b"secret", "other")));
        // With `limit` checks under way (no other test of this process runs one), one
        // more is not started.
        let slots: Vec<CheckSlot> = (0..2).filter_map(|_| CheckSlot::take(2)).collect();
        assert_eq!(slots.len(), 2);
        let (raw, h) = head("Authorization: Basic YWxpY2U6d3Jvbmc=\r\n");
        let Check::Verify(pending) = authorized(&auth, &cache, raw.as_bytes(), &h) else {
            panic!("a check");
        };
        assert_eq!(pending.run(&cache, 2).await, Verdict::Busy);
        drop(slots);
        assert!(CheckSlot::take(1).is_some(), "slots are given back");
    }

    #[test]
    fn argon2_entries_verify() {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(&[5u8; 16]).unwrap();
        let params = argon2::Params::new(64, 1, 1, None).unwrap();
        let hasher =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let hash = hasher.hash_password(b"secret", &salt).unwrap().to_string();
        assert!(hash.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{hash}");
        assert!(verify(b"secret", &hash));
        assert!(!verify(b"Secret", &hash));
        assert!(!verify(b"secret", "$argon2id$broken"));
    }

    #[test]
    fn cache_is_bounded() {
        let cache = AuthCache::default();
        for i in 0..1000u32 {
            cache.insert(cache.fingerprint(&i.to_le_bytes(), b"p", "h"));
        }
        assert_eq!(cache.lines.borrow().len(), CACHE_LINES);
        assert!(cache.contains(cache.fingerprint(&999u32.to_le_bytes(), b"p", "h")));
        assert!(!cache.contains(cache.fingerprint(&0u32.to_le_bytes(), b"p", "h")));
    }
}
