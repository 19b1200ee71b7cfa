//! Per-stream scratch space kept by the worker for the next stream: the HTTP/1.1 head a
//! stream's request becomes, its parsed spans, the upstream request head and the
//! upstream response's spans. Each stream used to allocate (and free) these four; with
//! hundreds of streams a second that was a third of an h2 stream's `malloc` calls.
//!
//! The worker is one thread, so the spares sit in a `RefCell` (no lock). Each taken
//! scratch is emptied, so nothing of one stream reaches the next; a scratch that grew
//! past the usual size (a large head) is dropped rather than kept, and the worker keeps
//! at most `SPARES` of them: the memory held is bounded however large a burst was.

use std::cell::RefCell;
use std::mem;

use crate::codec::http1::{HeaderSpan, RequestHead, ResponseHead};

/// Most spare scratches of each kind a worker keeps: one per stream in flight on a few
/// busy connections (32 x 16 = 512), as for the spare upstream buffers.
const SPARES: usize = 1024;
/// Larger byte buffers are not kept (a usual request head is a few hundred bytes).
const KEPT_BYTES: usize = 2048;
/// Nor are span lists longer than this (a usual head has a dozen fields).
const KEPT_SPANS: usize = 32;

/// Space for a stream's request: the HTTP/1.1 head and its parsed spans.
#[derive(Default)]
pub struct RequestScratch {
    pub head: Vec<u8>,
    pub req: RequestHead,
}

/// Space for one upstream exchange: the request head sent and the response's spans.
#[derive(Default)]
pub struct ExchangeScratch {
    pub out: Vec<u8>,
    pub resp: ResponseHead,
}

/// What a scratch needs to be reused.
trait Reuse: Default {
    /// Empties it for the next stream; `false`: too large to keep.
    fn reset(&mut self) -> bool;
}

impl Reuse for RequestScratch {
    fn reset(&mut self) -> bool {
        self.head.clear();
        let spans = fresh(&mut self.req.headers);
        self.req = RequestHead {
            headers: spans,
            ..RequestHead::default()
        };
        self.head.capacity() <= KEPT_BYTES && self.req.headers.capacity() <= KEPT_SPANS
    }
}

impl Reuse for ExchangeScratch {
    fn reset(&mut self) -> bool {
        self.out.clear();
        let spans = fresh(&mut self.resp.headers);
        self.resp = ResponseHead {
            headers: spans,
            ..ResponseHead::default()
        };
        self.out.capacity() <= KEPT_BYTES && self.resp.headers.capacity() <= KEPT_SPANS
    }
}

/// The span list, emptied, keeping its allocation.
fn fresh(spans: &mut Vec<HeaderSpan>) -> Vec<HeaderSpan> {
    let mut spans = mem::take(spans);
    spans.clear();
    spans
}

/// The worker's spare scratches.
#[derive(Default)]
pub struct Scratches {
    requests: RefCell<Vec<RequestScratch>>,
    exchanges: RefCell<Vec<ExchangeScratch>>,
}

impl Scratches {
    pub fn take_request(&self) -> RequestScratch {
        take(&self.requests)
    }

    pub fn give_request(&self, scratch: RequestScratch) {
        give(&self.requests, scratch);
    }

    pub fn take_exchange(&self) -> ExchangeScratch {
        take(&self.exchanges)
    }

    pub fn give_exchange(&self, scratch: ExchangeScratch) {
        give(&self.exchanges, scratch);
    }
}

fn take<T: Reuse>(spares: &RefCell<Vec<T>>) -> T {
    spares.borrow_mut().pop().unwrap_or_default()
}

fn give<T: Reuse>(spares: &RefCell<Vec<T>>, mut scratch: T) {
    let mut spares = spares.borrow_mut();
    if spares.len() < SPARES && scratch.reset() {
        spares.push(scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::BodyFraming;

    #[test]
    fn a_given_scratch_comes_back_empty_with_its_allocations() {
        let spares = Scratches::default();
        let mut r = spares.take_request();
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
        spares.give_request(r);
        let r = spares.take_request();
        assert_eq!((r.head.len(), r.head.as_ptr()), (0, at));
        assert!(r.req.headers.is_empty() && r.req.headers.capacity() >= 1);
        assert_eq!((r.req.framing, r.req.host), (BodyFraming::None, None));
        let mut e = spares.take_exchange();
        e.resp.status = 502;
        e.resp.head_len = 9;
        spares.give_exchange(e);
        let e = spares.take_exchange();
        assert_eq!((e.resp.status, e.resp.head_len), (0, 0));
    }

    #[test]
    fn large_scratches_and_spares_past_the_cap_are_dropped() {
        let spares = Scratches::default();
        let mut big = spares.take_request();
        big.head.reserve(KEPT_BYTES + 1);
        spares.give_request(big);
        assert!(spares.requests.borrow().is_empty());
        for _ in 0..SPARES + 5 {
            spares.give_exchange(ExchangeScratch::default());
        }
        assert_eq!(spares.exchanges.borrow().len(), SPARES);
    }
}
