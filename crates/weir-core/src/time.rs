//! Timeouts that cost little on the request path.
//!
//! Arming a tokio timer means reading the clock, cloning the runtime handle and inserting
//! into (then removing from) the timer wheel. Two ways around that, for two kinds of wait:
//!
//! - `with_timeout`: most writes complete on their first poll, so it polls once first and
//!   arms a timer only if the operation has to wait.
//! - `LazyTimer`: the waits every keep-alive request makes (for the next request, for the
//!   response head) usually do have to wait, and their deadline moves forward with every
//!   request. A `LazyTimer` keeps one timer armed per connection and moves it only when it
//!   fires before the current deadline (or when the deadline moves earlier), so a busy
//!   connection touches the timer wheel about once per timeout period instead of twice
//!   per request, and its deadlines are computed from times the request path already read.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

pub use tokio::time::error::Elapsed;

/// Like `tokio::time::timeout`, but without a timer when `fut` is ready at once.
pub async fn with_timeout<F: Future>(duration: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(out);
    }
    tokio::time::timeout(duration, fut).await
}

/// How a wait for a peer ended without its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The per-read bound (`client_timeout`, `response_timeout`) passed.
    Timeout,
    /// A client's request body fell below the listener's `min_body_rate`.
    TooSlow,
}

/// A client's request body against the listener's `min_body_rate`: Weir may wait for it
/// `grace`, plus one second for every `bytes_per_second` bytes it has sent. Only the time
/// spent waiting for the client counts (a read that is ready at once costs nothing and no
/// clock read); the time the upstream takes to accept what was read does not, so a slow
/// upstream is never blamed on the client. A trickle of a byte every few seconds, which
/// `client_timeout` alone lets hold a connection (and an upstream connection) for as long
/// as it likes, ends once `grace` is spent.
pub struct Pace {
    rate: weir_config::MinBodyRate,
    /// Body bytes received (framing included).
    received: u64,
    /// Time spent waiting for them.
    waited: Duration,
    /// The client sent `Expect: 100-continue` with no body byte: until a 100 goes out to
    /// it (the upstream's, or Weir's own), its wait is the upstream's, not its own.
    continued: Option<Rc<Continued>>,
}

/// Whether (and when) a client that sent `Expect: 100-continue` was told to go on: marked
/// when a 100 goes out to it (`forward::h1::Http1Interim`: the upstream's, or Weir's own
/// after a second of upstream silence), which wakes a body read waiting for it, so that
/// from then on the wait counts.
#[derive(Default)]
pub struct Continued {
    told: Cell<bool>,
    /// The client sent a body byte without waiting (curl does after a second): it needs
    /// no 100 any more (RFC 9110 10.1.1 lets the server omit it).
    began: Cell<bool>,
    notify: Notify,
}

impl Continued {
    /// Whether the client has had its 100.
    pub fn told(&self) -> bool {
        self.told.get()
    }

    /// Whether the client still waits for a 100: none went out, and it sent no body byte.
    pub fn waits(&self) -> bool {
        !self.told.get() && !self.began.get()
    }

    /// The client has its 100: its waits count from now.
    pub fn mark(&self) {
        if !self.told.replace(true) {
            self.notify.notify_waiters();
        }
    }
}

impl Pace {
    pub fn new(rate: weir_config::MinBodyRate) -> Pace {
        Pace {
            rate,
            received: 0,
            waited: Duration::ZERO,
            continued: None,
        }
    }

    /// Counts no wait before `continued` is marked (see `Pace::continued`).
    pub fn after_continue(self, continued: Option<Rc<Continued>>) -> Pace {
        Pace { continued, ..self }
    }

    /// The mark to wait for while the client waits for its 100 and has sent no byte.
    fn untold(&self) -> Option<&Continued> {
        let c = self.continued.as_deref()?;
        (self.received == 0 && !c.told()).then_some(c)
    }

    /// Counts `n` more bytes received.
    pub fn add(&mut self, n: usize) {
        if let Some(c) = self.continued.as_deref().filter(|_| self.received == 0) {
            c.began.set(true);
        }
        self.received = self.received.saturating_add(n as u64);
    }

    /// How much longer Weir may wait for the client.
    fn left(&self) -> Duration {
        let earned = self.received.saturating_mul(1_000_000_000) / self.rate.bytes_per_second;
        let allowed = self.rate.grace.saturating_add(Duration::from_nanos(earned));
        allowed.saturating_sub(self.waited)
    }
}

/// `fut` within `timeout`, and within what `pace` leaves when there is one (a client's
/// request body). Polled once first, as [`with_timeout`]: a ready read arms no timer.
pub async fn paced<F: Future>(
    pace: Option<&mut Pace>,
    timeout: Duration,
    fut: F,
) -> Result<F::Output, Waited> {
    let Some(pace) = pace else {
        return with_timeout(timeout, fut)
            .await
            .map_err(|_| Waited::Timeout);
    };
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(out);
    }
    if let Some(continued) = pace.untold() {
        // Not the client's wait until its 100 goes out; from then on, as any other.
        let told = continued.notify.notified();
        tokio::select! {
            out = tokio::time::timeout(timeout, fut.as_mut()) => {
                return out.map_err(|_| Waited::Timeout);
            }
            () = told => {}
        }
    }
    let left = pace.left();
    let started = Instant::now();
    let out = tokio::time::timeout(timeout.min(left), fut).await;
    pace.waited += started.elapsed();
    out.map_err(|_| match left < timeout {
        true => Waited::TooSlow,
        false => Waited::Timeout,
    })
}

/// A deadline that can move with every request at the cost of a comparison and a store.
pub struct LazyTimer {
    /// Armed at `armed` once first polled; kept for the owner's lifetime.
    sleep: Option<Pin<Box<Sleep>>>,
    armed: Instant,
    deadline: Instant,
    /// The waker the armed timer was last polled with. While the timer has not fired and
    /// this waker wakes the task polling now, polling the timer again would only register
    /// the same waker again (about 120 instructions, twice per proxied request).
    registered: Option<Waker>,
}

/// A timer whose deadline is now (reads the clock): `set` its deadline before a wait.
impl Default for LazyTimer {
    fn default() -> Self {
        LazyTimer::new(Instant::now())
    }
}

impl LazyTimer {
    /// A timer whose deadline is `now` until `set` moves it (taking a time the caller
    /// already read saves a clock read per connection).
    pub fn new(now: Instant) -> LazyTimer {
        LazyTimer {
            sleep: None,
            armed: now,
            deadline: now,
            registered: None,
        }
    }

    /// Sets the deadline of the next wait. Later than the armed timer: only recorded (the
    /// timer re-arms when it fires). Earlier: the timer is re-armed now.
    pub fn set(&mut self, deadline: Instant) {
        self.deadline = deadline;
        if let Some(sleep) = &mut self.sleep {
            if deadline < self.armed {
                sleep.as_mut().reset(deadline);
                self.armed = deadline;
                self.registered = None;
            }
        }
    }

    /// Ready once the deadline has passed.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                let same_task = self
                    .registered
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()));
                if same_task && !sleep.is_elapsed() {
                    return Poll::Pending;
                }
                sleep
            }
            None => {
                self.armed = self.deadline;
                self.sleep
                    .insert(Box::pin(tokio::time::sleep_until(self.deadline)))
            }
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                if !self
                    .registered
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    self.registered = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            // The timer fired, so the time is past `armed`: past the deadline too unless
            // the deadline moved later since it was armed.
            if self.deadline <= self.armed {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(self.deadline);
            self.armed = self.deadline;
        }
    }

    /// Runs `fut` until it completes (`Some`) or the deadline set last passes (`None`). A
    /// future that is ready at once never looks at the timer. `fut` comes pinned by the
    /// caller (`pin!`): the wait is then this one poll function, not an `async fn` around it
    /// holding `fut` in a state of its own (twice per proxied request).
    pub fn within<'a, F: Future + Unpin + 'a>(
        &'a mut self,
        mut fut: F,
    ) -> impl Future<Output = Option<F::Output>> + 'a {
        poll_fn(move |cx| {
            if let Poll::Ready(out) = Pin::new(&mut fut).poll(cx) {
                return Poll::Ready(Some(out));
            }
            self.poll_expired(cx).map(|()| None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(bytes_per_second: u64, grace_secs: u64) -> Pace {
        Pace::new(weir_config::MinBodyRate {
            bytes_per_second,
            grace: Duration::from_secs(grace_secs),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_may_wait_its_grace_plus_what_its_bytes_earned() {
        let mut p = pace(100, 1);
        let never = std::future::pending::<()>;
        let start = Instant::now();
        let got = paced(Some(&mut p), Duration::from_secs(60), never()).await;
        assert_eq!(
            (got, start.elapsed()),
            (Err(Waited::TooSlow), Duration::from_secs(1))
        );
        // 250 bytes earned 2.5 s more; the grace is spent.
        p.add(250);
        let start = Instant::now();
        let got = paced(Some(&mut p), Duration::from_secs(60), never()).await;
        assert_eq!(got, Err(Waited::TooSlow));
        assert_eq!(start.elapsed(), Duration::from_millis(2500));
        // `client_timeout` still bounds each read, and a ready read costs no waiting.
        let mut generous = pace(1, 100);
        let got = paced(Some(&mut generous), Duration::from_secs(2), never()).await;
        assert_eq!(got, Err(Waited::Timeout));
        assert_eq!(
            paced(Some(&mut p), Duration::ZERO, async { 7 }).await,
            Ok(7)
        );
        assert_eq!(paced(None, Duration::ZERO, async { 8 }).await, Ok(8));
    }

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

    /// Waits on `timer` with a future that never completes; returns when it expired.
    async fn expiry(timer: &mut LazyTimer) -> Instant {
        assert!(timer.within(std::future::pending::<()>()).await.is_none());
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn lazy_timer_expires_at_its_deadline() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(Instant::now());
        timer.set(start + Duration::from_millis(10));
        assert_eq!(expiry(&mut timer).await, start + Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn lazy_timer_follows_a_later_deadline_without_expiring_early() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(Instant::now());
        timer.set(start + Duration::from_millis(10));
        assert_eq!(timer.within(std::pin::pin!(async { 1 })).await, Some(1));
        assert!(
            timer.sleep.is_none(),
            "a ready future does not arm the timer"
        );
        // This wait has to wait: it arms the timer at +10 ms.
        let quick = timer
            .within(std::pin::pin!(tokio::time::sleep(Duration::from_millis(5))))
            .await;
        assert!(quick.is_some());
        // Moved later: recorded only; the +10 ms timer re-arms when it fires.
        timer.set(start + Duration::from_millis(50));
        assert_eq!(timer.armed, start + Duration::from_millis(10));
        assert_eq!(expiry(&mut timer).await, start + Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn lazy_timer_rearms_at_once_for_an_earlier_deadline() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(Instant::now());
        timer.set(start + Duration::from_millis(100));
        let quick = timer
            .within(std::pin::pin!(tokio::time::sleep(Duration::from_millis(1))))
            .await;
        assert!(quick.is_some());
        timer.set(start + Duration::from_millis(20));
        assert_eq!(expiry(&mut timer).await, start + Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn lazy_timer_is_reusable_after_expiring() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(Instant::now());
        timer.set(start + Duration::from_millis(10));
        expiry(&mut timer).await;
        timer.set(start + Duration::from_millis(30));
        let done = timer
            .within(std::pin::pin!(tokio::time::sleep(Duration::from_millis(5))))
            .await;
        assert!(
            done.is_some(),
            "a wait shorter than the new deadline completes"
        );
        assert_eq!(expiry(&mut timer).await, start + Duration::from_millis(30));
    }

    #[tokio::test(start_paused = true)]
    async fn lazy_timer_polled_again_before_it_fires_still_expires() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(start);
        timer.set(start + Duration::from_millis(10));
        // Wakes its own task a few times (each wake polls the timer again, which then skips
        // the armed Sleep), then waits forever.
        let restless = async {
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            std::future::pending::<()>().await
        };
        assert!(timer.within(std::pin::pin!(restless)).await.is_none());
        assert_eq!(Instant::now(), start + Duration::from_millis(10));
        assert!(timer.registered.is_some());
    }
}
