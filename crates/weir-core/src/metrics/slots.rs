//! An append-only array that other threads may extend while a worker reads it.
//!
//! Metric shards are indexed by slot, and a reload may add listeners, routes, upstreams or
//! servers. Slots live in chunks of doubling size that are never moved or freed, so a
//! worker can hold `&RouteMetrics` across an await while the control plane adds slots, and
//! a lookup is two `OnceLock` loads: no lock and no atomic read-modify-write.

use std::sync::OnceLock;

/// Chunk `k` holds slots `2^k - 1 .. 2^(k+1) - 1`; 32 chunks cover every `u32` slot.
const CHUNKS: usize = 32;

pub struct Slots<T> {
    chunks: [OnceLock<Box<[OnceLock<T>]>>; CHUNKS],
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots").finish_non_exhaustive()
    }
}

/// The chunk and the offset in it of slot `i`.
#[inline]
fn locate(i: usize) -> (usize, usize) {
    let n = i + 1;
    let chunk = (usize::BITS - 1 - n.leading_zeros()) as usize;
    (chunk, n - (1 << chunk))
}

impl<T> Slots<T> {
    /// The value in slot `i`, if it was filled.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        let (chunk, offset) = locate(i);
        self.chunks.get(chunk)?.get()?.get(offset)?.get()
    }

    /// The value in slot `i`, filling it with `init` first if it is empty. `None` only for
    /// a slot beyond the `u32` range.
    pub fn get_or_init(&self, i: usize, init: impl FnOnce() -> T) -> Option<&T> {
        let (chunk, offset) = locate(i);
        let chunk = self
            .chunks
            .get(chunk)?
            .get_or_init(|| (0..(1usize << chunk)).map(|_| OnceLock::new()).collect());
        Some(chunk.get(offset)?.get_or_init(init))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_in_any_order_and_stay_put() {
        let slots = Slots::default();
        assert!(slots.get(0).is_none());
        let first: *const u32 = slots.get_or_init(0, || 10).unwrap();
        for i in [1, 2, 3, 6, 7, 100, 1000] {
            slots.get_or_init(i, || i as u32);
        }
        assert_eq!(slots.get(0), Some(&10));
        assert_eq!(slots.get(7), Some(&7));
        assert_eq!(slots.get(1000), Some(&1000));
        assert!(slots.get(5).is_none());
        assert_eq!(slots.get_or_init(0, || 99), Some(&10));
        assert!(std::ptr::eq(first, slots.get(0).unwrap()));
    }

    #[test]
    fn locate_is_contiguous() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1), (1, 0));
        assert_eq!(locate(2), (1, 1));
        assert_eq!(locate(3), (2, 0));
        assert_eq!(locate(6), (2, 3));
        assert_eq!(locate(7), (3, 0));
    }
}
