//! A request's future in memory the worker reuses, instead of a `Box` per request.
//!
//! An HTTP/1 connection boxes the future that handles each request (`proxy::http1`): inline,
//! every idle connection would carry its ~7 KiB. But a block that large is mimalloc's slow
//! path (over 1 KiB, and aligned: about 230 instructions per request for the allocation and
//! its free, 1.4 % of a proxied request's user space). [`place`] puts the future in a block
//! from the worker's spares instead and gives the block back when the future is dropped, so
//! a worker allocates only as many blocks as it ever has requests in flight at once (the
//! spares are trimmed like its buffers, `memory::Spares`), and an idle connection still
//! holds none.
//!
//! Unsafe inside: a block is raw memory with the layout of the future placed in it, which
//! stays there, unmoved, from [`place`] until the [`Placed`] is dropped.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

use crate::memory::Spares;

/// Raw memory of one layout, freed on drop.
pub struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Block {
    fn new(layout: Layout) -> Block {
        // SAFETY: `placed_layout` never makes a zero-sized layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        Block { ptr, layout }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `Block::new` with this layout; no future is in it (a
        // `Placed` holds its block in a `ManuallyDrop` and empties it before giving it back).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The layout a future of type `F` is placed with (at least one byte: an allocation must
/// not be zero-sized).
fn placed_layout<F>() -> Layout {
    let layout = Layout::new::<F>();
    Layout::from_size_align(layout.size().max(1), layout.align()).unwrap_or(layout)
}

/// A future in a block of `spares`, polled in place; dropping it drops the future and gives
/// the block back. Like `Pin<Box<F>>`, it can be moved while `F` cannot.
pub struct Placed<'s, F> {
    block: ManuallyDrop<Block>,
    spares: &'s Spares<Block>,
    /// It owns an `F` (for the drop check).
    _owns: PhantomData<F>,
}

/// Puts the future `make` makes in a block from `spares` (a new one if none is spare, or
/// the spare one was made for another type). Made in place: a future made first and then
/// moved would be copied whole (7 KiB, where a `Box` writes only what its first state
/// holds), so `make` should be a call of the `async fn`, and this is inlined.
#[inline(always)]
pub fn place<F: Future>(spares: &Spares<Block>, make: impl FnOnce() -> F) -> Placed<'_, F> {
    let layout = placed_layout::<F>();
    let block = match spares.take() {
        Some(block) if block.layout == layout => block,
        _ => Block::new(layout),
    };
    // SAFETY: the block is `layout`, F's size and alignment, and holds nothing.
    unsafe { block.ptr.cast::<F>().as_ptr().write(make()) };
    Placed {
        block: ManuallyDrop::new(block),
        spares,
        _owns: PhantomData,
    }
}

// The future itself never moves: only the pointer to it does.
impl<F> Unpin for Placed<'_, F> {}

impl<F: Future> Future for Placed<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let fut = self.block.ptr.cast::<F>().as_ptr();
        // SAFETY: `place` wrote an F there, which is neither moved nor dropped before this
        // `Placed` is dropped, and `&mut self` makes this the only reference to it.
        unsafe { Pin::new_unchecked(&mut *fut) }.poll(cx)
    }
}

impl<F> Drop for Placed<'_, F> {
    fn drop(&mut self) {
        // SAFETY: the F written by `place`, dropped once; should its drop panic, the block
        // is leaked, never reused.
        unsafe { std::ptr::drop_in_place(self.block.ptr.cast::<F>().as_ptr()) };
        // SAFETY: the block is taken once, here, and `self.block` not used after.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.spares.give(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// Counts its drops; ready with its number on its second poll.
    struct Counted {
        n: u64,
        polled: bool,
        drops: Rc<Cell<u32>>,
        /// Large enough to take mimalloc's slow path, as the request's future does.
        _state: [u8; 4096],
    }

    impl Future for Counted {
        type Output = u64;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
            if std::mem::replace(&mut self.polled, true) {
                return Poll::Ready(self.n);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.drops.set(self.drops.get() + 1);
        }
    }

    fn counted(n: u64, drops: &Rc<Cell<u32>>) -> Counted {
        Counted {
            n,
            polled: false,
            drops: drops.clone(),
            _state: [0; 4096],
        }
    }

    #[tokio::test]
    async fn the_next_future_reuses_the_block_and_each_is_dropped_once() {
        let spares = Spares::new(4);
        let drops = Rc::new(Cell::new(0));
        let first = place(&spares, || counted(1, &drops));
        let at = first.block.ptr;
        assert_eq!(first.await, 1);
        assert_eq!((drops.get(), spares.len()), (1, 1));
        let second = place(&spares, || counted(2, &drops));
        assert_eq!(second.block.ptr, at, "the spare block was reused");
        assert!(spares.is_empty());
        assert_eq!(second.await, 2);
        assert_eq!(drops.get(), 2);
        // Dropped before it completed (a client gone mid-request): dropped all the same.
        let third = place(&spares, || counted(3, &drops));
        drop(third);
        assert_eq!((drops.get(), spares.len()), (3, 1));
    }

    #[tokio::test]
    async fn futures_in_flight_at_once_each_get_a_block_and_another_type_its_own() {
        let spares = Spares::new(4);
        let drops = Rc::new(Cell::new(0));
        let (a, b) = (
            place(&spares, || counted(1, &drops)),
            place(&spares, || counted(2, &drops)),
        );
        assert_ne!(a.block.ptr, b.block.ptr);
        assert_eq!((a.await, b.await), (1, 2));
        assert_eq!(spares.len(), 2);
        // A block of another layout is not used for it (the spare taken is freed).
        let small = place(&spares, || std::future::ready(7u8));
        assert_eq!(
            small.block.layout,
            placed_layout::<std::future::Ready<u8>>()
        );
        assert_eq!(small.await, 7);
        assert_eq!((drops.get(), spares.len()), (2, 2));
    }
}
