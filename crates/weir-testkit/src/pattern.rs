//! Deterministic body pattern and an incremental FNV-1a 64 hasher.
//!
//! Large bodies are never compared byte by byte in memory: one end generates
//! [`pattern`] bytes (a pure function of the offset, so any slice can be
//! produced independently), both ends feed what they send or receive into a
//! [`Hasher`], and the test compares `(length, hash)` pairs, for example with
//! [`pattern_hash`]. The pattern is printable ASCII (`A-Za-z0-9-_`) and has no
//! short period, so a dropped, duplicated or reordered block changes the hash.

/// The 64 symbols the pattern is drawn from.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Size of the buffer used when generating pattern data in pieces.
pub(crate) const PATTERN_BLOCK: usize = 64 * 1024;

/// The pattern byte at `offset`.
pub fn pattern_byte(offset: u64) -> u8 {
    // Top six bits of a multiplicative (Fibonacci) hash of the offset.
    let x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ALPHABET[(x >> 58) as usize]
}

/// Fills `buf` with the pattern bytes for offsets `offset..offset + buf.len()`.
pub fn fill_pattern(offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(offset + i as u64);
    }
}

/// The first `len` pattern bytes, lazily.
pub fn pattern(len: u64) -> impl Iterator<Item = u8> {
    (0..len).map(pattern_byte)
}

/// The first `len` pattern bytes in a vector (only for sizes that fit in memory).
pub fn pattern_vec(len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(0, &mut v);
    v
}

/// FNV-1a 64 hash of the first `len` pattern bytes, computed in 64 KiB pieces.
pub fn pattern_hash(len: u64) -> u64 {
    let mut hasher = Hasher::new();
    let mut buf = vec![0; PATTERN_BLOCK];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PATTERN_BLOCK as u64) as usize;
        fill_pattern(off, &mut buf[..n]);
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    hasher.finish()
}

/// FNV-1a 64 hash of `data` in one go.
pub fn hash_bytes(data: &[u8]) -> u64 {
    let mut h = Hasher::new();
    h.update(data);
    h.finish()
}

/// The body the [`sink`](crate::Backend::sink) backend answers with for a
/// request body of `len` bytes hashing to `hash`: `"<len> <hash as 16 lowercase hex digits>\n"`.
pub fn sink_summary(len: u64, hash: u64) -> String {
    format!("{len} {hash:016x}\n")
}

/// Incremental FNV-1a 64 hasher that also counts the bytes it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hasher {
    state: u64,
    len: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Self::new()
    }
}

impl Hasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> Self {
        Hasher {
            state: FNV_OFFSET_BASIS,
            len: 0,
        }
    }

    /// Feeds `data`; feeding a body in any split gives the same result.
    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.state;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        self.state = h;
        self.len += data.len() as u64;
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        self.state
    }

    /// Number of bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if no bytes have been fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The [`sink_summary`] line for everything fed so far.
    pub fn summary(&self) -> String {
        sink_summary(self.len, self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_values() {
        assert_eq!(hash_bytes(b""), 0xcbf29ce484222325);
        assert_eq!(hash_bytes(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(hash_bytes(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn pattern_is_consistent() {
        let len = 200_000;
        let v = pattern_vec(len);
        assert!(v.iter().all(|b| ALPHABET.contains(b)));
        assert_eq!(pattern(len as u64).collect::<Vec<_>>(), v);
        let mut piece = vec![0; 1000];
        fill_pattern(12_345, &mut piece);
        assert_eq!(&piece[..], &v[12_345..13_345]);
        let mut h = Hasher::new();
        for c in v.chunks(777) {
            h.update(c);
        }
        assert_eq!(h.finish(), hash_bytes(&v));
        assert_eq!(h.finish(), pattern_hash(len as u64));
        assert_eq!(h.len(), len as u64);
        assert_eq!(h.summary(), format!("{len} {:016x}\n", hash_bytes(&v)));
        // No short period: shifting by a block size changes the data.
        assert_ne!(&v[..4096], &v[65536..65536 + 4096]);
        assert_ne!(&v[..251], &v[251..502]);
    }
}
