//! Per-stream scratch space kept by the worker for the next stream: the HTTP/1.1 head a
//! stream's request becomes, its parsed spans, the upstream request head and the
//! upstream response's spans. Each stream used to allocate (and free) these four; with
//! hundreds of streams a second that was a third of an h2 stream's `malloc` calls.
//!
//! The upstream response's first bytes (its head, often its whole body) are copied into
//! one `Bytes` per stream, which the h2 response's header values and first DATA slice.
//! They are cut from a shared block (`ARENA_BLOCK`) rather than allocated each: a block is
//! freed when the last response cut from it has been written, and reused in place when it
//! is the last one left.
//!
//! The wait for the response head uses the exchange scratch's timer, so a stream does
//! not arm (and remove) a timer of its own.
//!
//! The worker is one thread, so the spares sit in a `RefCell` (no lock). Each taken
//! scratch is emptied, so nothing of one stream reaches the next; a scratch that grew
//! past the usual size (a large head) is dropped rather than kept, and the worker keeps
//! at most `SPARES` of them: the memory held is bounded however large a burst was, and
//! what a burst left is freed once unused for a while (`memory::Spares`).

use std::cell::RefCell;
use std::mem;

use bytes::{Bytes, BytesMut};

use crate::codec::http1::{HeaderSpan, RequestHead, ResponseHead};
use crate::memory::Spares;
use crate::time::LazyTimer;

/// Most spare scratches of each kind a worker keeps: one per stream in flight on a few
/// busy connections (twice 32 x 16), as for the spare upstream buffers: at most about
/// 3.5 MiB of each kind per worker, while they are used.
const SPARES: usize = 1024;
/// Larger byte buffers are not kept (a usual request head is a few hundred bytes).
const KEPT_BYTES: usize = 2048;
/// Nor are span lists longer than this (a usual head has a dozen fields).
const KEPT_SPANS: usize = 32;

/// Size of the blocks responses are copied into (one upstream buffer: a response's first
/// read is at most that).
const ARENA_BLOCK: usize = crate::worker::UPSTREAM_BUFFER;

/// Space for a stream's request: the HTTP/1.1 head and its parsed spans.
#[derive(Default)]
pub struct RequestScratch {
    pub head: Vec<u8>,
    pub req: RequestHead,
}

/// Space for one upstream exchange: the request head sent, the response's spans, and
/// the timer of the wait for the response head.
#[derive(Default)]
pub struct ExchangeScratch {
    pub out: Vec<u8>,
    pub resp: ResponseHead,
    /// Kept armed from stream to stream (`LazyTimer`): a stream only moves its deadline,
    /// where a timer of its own cost a `Box<Sleep>`, a timer-wheel insert and removal and
    /// their locks (about 0.6k instructions per stream). Each exchange sets its deadline
    /// before it waits. Between streams it may fire with nobody waiting: it wakes the
    /// last stream's finished task, a no-op, at most once per `response_timeout`.
    pub timer: LazyTimer,
}

/// What a scratch needs to be reused.
pub trait Reuse: Default {
    /// Empties it for the next stream; `false`: too large to keep.
    fn reset(&mut self) -> bool;
}

impl Reuse for RequestScratch {
    fn reset(&mut self) -> bool {
        self.req = RequestHead {
            headers: mem::take(&mut self.req.headers),
            ..RequestHead::default()
        };
        emptied(&mut self.head, &mut self.req.headers)
    }
}

impl Reuse for ExchangeScratch {
    fn reset(&mut self) -> bool {
        self.resp = ResponseHead {
            headers: mem::take(&mut self.resp.headers),
            ..ResponseHead::default()
        };
        emptied(&mut self.out, &mut self.resp.headers)
    }
}

/// Empties a scratch's bytes and spans, keeping their allocations; whether they are
/// small enough to keep.
fn emptied(bytes: &mut Vec<u8>, spans: &mut Vec<HeaderSpan>) -> bool {
    bytes.clear();
    spans.clear();
    bytes.capacity() <= KEPT_BYTES && spans.capacity() <= KEPT_SPANS
}

/// The worker's spare scratches of one kind.
pub struct Kept<T>(Spares<T>);

impl<T: Reuse> Kept<T> {
    /// A spare scratch, or a new one.
    pub fn take(&self) -> T {
        self.0.take().unwrap_or_default()
    }

    /// Keeps `scratch`, emptied, for the next stream, unless it grew too large.
    pub fn give(&self, mut scratch: T) {
        if scratch.reset() {
            self.0.give(scratch);
        }
    }
}

/// The worker's spare scratches.
pub struct Scratches {
    pub requests: Kept<RequestScratch>,
    pub exchanges: Kept<ExchangeScratch>,
    /// The block responses are being copied into (empty: the next copy starts there).
    arena: RefCell<BytesMut>,
    /// Where `render` writes before the copy into the arena.
    spare: RefCell<Vec<u8>>,
}

impl Default for Scratches {
    fn default() -> Self {
        Scratches {
            requests: Kept(Spares::new(SPARES)),
            exchanges: Kept(Spares::new(SPARES)),
            // With this capacity as its first, the arena's next blocks are as large.
            arena: RefCell::new(BytesMut::with_capacity(ARENA_BLOCK)),
            spare: RefCell::default(),
        }
    }
}

impl Scratches {
    /// What `write` writes (into a spare buffer, emptied first) as `Bytes` cut from the
    /// arena, and `write`'s result: values Weir makes for a request, written once and
    /// sliced by the fields that hold them instead of an allocation each. `write` must
    /// not call `render` itself.
    pub fn render<R>(&self, write: impl FnOnce(&mut Vec<u8>) -> R) -> (Bytes, R) {
        let mut spare = self.spare.borrow_mut();
        spare.clear();
        let result = write(&mut spare);
        let bytes = self.copy(&spare);
        if spare.capacity() > KEPT_BYTES {
            *spare = Vec::new();
        }
        (bytes, result)
    }

    /// `data` as `Bytes`, copied into the current block (a new one when it is full and
    /// still referenced).
    pub fn copy(&self, data: &[u8]) -> Bytes {
        if data.len() > ARENA_BLOCK {
            // The block would grow to fit it and stay that large for good.
            return Bytes::copy_from_slice(data);
        }
        let mut arena = self.arena.borrow_mut();
        arena.reserve(data.len());
        arena.extend_from_slice(data);
        arena.split().freeze()
    }

    /// Frees the spare scratches no stream took since the last trim.
    pub fn trim(&self) {
        self.requests.0.trim();
        self.exchanges.0.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::BodyFraming;

    #[test]
    fn a_given_scratch_comes_back_empty_with_its_allocations() {
        let spares = Scratches::default();
        let mut r = spares.requests.take();
        r.head.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        r.req.headers.push(HeaderSpan {
            name: 0..3,
            value: 4..5,
            line_end: 7,
            kind: crate::codec::http1::HeaderKind::Other,
            connection_listed: false,
        });
        r.req.framing = BodyFraming::Chunked;
        r.req.host = Some(1..2);
        let at = r.head.as_ptr();
        spares.requests.give(r);
        let r = spares.requests.take();
        assert_eq!((r.head.len(), r.head.as_ptr()), (0, at));
        assert!(r.req.headers.is_empty() && r.req.headers.capacity() >= 1);
        assert_eq!((r.req.framing, r.req.host), (BodyFraming::None, None));
        let mut e = spares.exchanges.take();
        e.resp.status = 502;
        e.resp.head_len = 9;
        spares.exchanges.give(e);
        let e = spares.exchanges.take();
        assert_eq!((e.resp.status, e.resp.head_len), (0, 0));
    }

    #[test]
    fn copies_share_a_block_until_it_is_full() {
        let spares = Scratches::default();
        let a = spares.copy(b"first response");
        let b = spares.copy(b"second");
        assert_eq!((&a[..], &b[..]), (&b"first response"[..], &b"second"[..]));
        // Cut from one block, one after the other.
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
        let big = spares.copy(&[7; ARENA_BLOCK]);
        assert_eq!(big.len(), ARENA_BLOCK);
        assert!(big.iter().all(|&x| x == 7));
        assert_eq!(&a[..], b"first response");
        // Once every copy is dropped, the block is reused in place.
        let at = big.as_ptr();
        drop(big);
        assert_eq!(spares.copy(b"again").as_ptr(), at);
    }

    #[test]
    fn large_scratches_and_spares_past_the_cap_are_dropped() {
        let spares = Scratches::default();
        let mut big = spares.requests.take();
        big.head.reserve(KEPT_BYTES + 1);
        spares.requests.give(big);
        assert!(spares.requests.0.is_empty());
        for _ in 0..SPARES + 5 {
            spares.exchanges.give(ExchangeScratch::default());
        }
        assert_eq!(spares.exchanges.0.len(), SPARES);
    }
}
