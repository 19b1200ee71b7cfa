//! Timeouts that cost nothing when the operation is already complete.
//!
//! Arming a tokio timer means reading the clock, cloning the runtime handle and inserting
//! into (then removing from) the timer wheel. Most writes on the request path complete on
//! their first poll, so `with_timeout` polls once first and arms the timer only if the
//! operation has to wait.

use std::future::{poll_fn, Future};
use std::task::Poll;
use std::time::Duration;

pub use tokio::time::error::Elapsed;

/// Like `tokio::time::timeout`, but without a timer when `fut` is ready at once.
pub async fn with_timeout<F: Future>(duration: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(out);
    }
    tokio::time::timeout(duration, fut).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_future_needs_no_timer() {
        assert_eq!(
            with_timeout(Duration::ZERO, async { 7 }).await.ok(),
            Some(7)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pending_future_times_out() {
        let never = std::future::pending::<()>();
        assert!(with_timeout(Duration::from_millis(10), never)
            .await
            .is_err());
    }
}
