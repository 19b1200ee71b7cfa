//! The attempt-and-retry driver, one for every client x upstream pair.
//!
//! A request goes to the server the load balancer picks; a cell's [`Sender`] sends it there
//! (a connection or a stream obtained, the request and its body sent, 1xx heads relayed,
//! the final head awaited and put to [`Tries::relays`]) and says how the try ended. The
//! rules are here, once:
//!
//! - **Same server again**: a try the server did not process ([`Miss::unprocessed`]: a
//!   refused HTTP/2 stream, a pooled HTTP/1.1 connection found closed before any response
//!   byte for an idempotent request) goes again to that server (a new HTTP/1.1
//!   connection; an HTTP/2 stream on a connection not going away), at most
//!   [`MAX_UNPROCESSED`] times, if the request can still be sent as it was.
//! - **Another server**: `upstream::retry::may_retry` on the try's outcome (connect
//!   errors always; resets, timeouts and the listed statuses only for an idempotent
//!   request that can be sent again as it was, and never once the client has a 1xx),
//!   within `retry.attempts` and the retry budget. Each try writes the request for its
//!   own server (its `Host` when that names the server).
//! - **Counted once**: each try that is not relayed on its server (passive health,
//!   metrics) here; the relayed one when its response is relayed or refused
//!   ([`Accepted::count`]).

use std::time::{Duration, Instant};

use weir_config::UpstreamServer;

use super::{Failure, Reached, Target};
use crate::error::ProxyError;
use crate::metrics::shard::ServerMetrics;
use crate::otel::{AttemptEnd, RequestTrace};
use crate::request::LastTry;
use crate::upstream::retry::{may_retry, Outcome, Replay, Tried};
use crate::upstream::{Pick, RequestKey};
use crate::worker::Worker;

/// Most tries on one server while it does not process the request.
pub(crate) const MAX_UNPROCESSED: usize = 5;

/// What every try of a request shares.
pub(crate) struct Exchange<'a> {
    pub worker: &'a Worker,
    pub target: Target<'a>,
    /// The request's load-balancing key (retries pick with it too).
    pub key: RequestKey,
    pub idempotent: bool,
    /// The request's trace, when sampled: a client span per try.
    pub trace: Option<&'a RequestTrace>,
}

/// One try on one server.
#[derive(Clone, Copy)]
pub(crate) struct Attempt<'a> {
    pub server: &'a UpstreamServer,
    pub metrics: Option<&'a ServerMetrics>,
    /// When the try on this server began (the request's start for the first: no clock
    /// read).
    pub started: Instant,
    /// The last try on this server was not processed: an HTTP/1.1 try takes a new
    /// connection, not a pooled one (an HTTP/2 stream any that is not going away).
    pub fresh: bool,
}

/// How a try ended short of a relayed response.
pub(crate) struct Miss {
    pub failure: Failure,
    /// The server did not process the request: it may go again to that server.
    pub unprocessed: bool,
    /// A final head came, and [`Tries::relays`] sent the request on to another server.
    pub retried: Option<u16>,
    /// Refused before anything went to the server (the request cannot be sent there): not
    /// the server's try, so not counted, and no server in the access log.
    pub unsent: bool,
}

impl<F: Into<Failure>> From<F> for Miss {
    fn from(failure: F) -> Miss {
        Miss {
            failure: failure.into(),
            unprocessed: false,
            retried: None,
            unsent: false,
        }
    }
}

impl Miss {
    /// The request cannot go to the server as it is: `error` is the client's answer.
    pub fn unsent(error: ProxyError) -> Miss {
        Miss {
            unsent: true,
            ..Miss::from(error)
        }
    }
}

/// How a cell sends a request to one server.
pub(crate) trait Sender {
    /// What a relayed try leaves (its connection, or the relay's end).
    type Sent;

    /// Sends the request to `a.server`, relays 1xx heads, and puts the final head to
    /// `tries.relays`, returning its miss when the request is [`Miss::retried`].
    fn send(
        &mut self,
        a: &Attempt<'_>,
        tries: &mut Tries<'_>,
    ) -> impl std::future::Future<Output = Result<Self::Sent, Miss>>;

    /// Whether the request can be sent again as it was (its body whole, or none of it
    /// taken from the client yet).
    fn replayable(&self) -> bool;

    /// Whether the client already has a 1xx of this response (no other server then).
    fn responded(&self) -> bool;
}

/// Where a request stands among its tries.
pub(crate) struct Tries<'a> {
    /// What every try shares.
    pub x: &'a Exchange<'a>,
    pick: Pick,
    tried: Tried,
    /// The server picked after a retried head.
    next: Option<Pick>,
    /// When the current try's final head came.
    head_at: Option<Instant>,
}

impl Tries<'_> {
    /// `Ok` when the final head with `status` is relayed to the client; a [`Miss::retried`]
    /// when the retry rules send the request to another server instead (picked here). The
    /// sender says whether the request can go again as it was (`replayable`) and whether
    /// the client has a 1xx (`responded`).
    #[inline]
    pub fn relays(&mut self, status: u16, replayable: bool, responded: bool) -> Result<(), Miss> {
        self.head_at = Some(Instant::now());
        // Only 5xx statuses are retried (the config takes no others).
        if status < 500 {
            return Ok(());
        }
        self.next = self.next_pick(Outcome::Status(status), replayable, responded);
        match self.next {
            None => Ok(()),
            // The final head goes no further: the request was sent on.
            Some(_) => Err(Miss {
                retried: Some(status),
                ..Miss::from(ProxyError::UpstreamClosed)
            }),
        }
    }

    /// Counts try `a` relayed inside its sender, once (as [`Accepted::count`]).
    pub fn count(&self, a: &Attempt<'_>, result: Result<u16, ProxyError>) {
        let elapsed = self.head_at.map_or(Duration::ZERO, |at| at - a.started);
        count(self.x.target, a.metrics, &self.pick, result, elapsed);
    }

    /// The sticky-session `Set-Cookie` line the response carries, if any.
    pub fn set_cookie(&self) -> Option<&[u8]> {
        let cookie = self.x.target.pool.set_cookie(self.pick.server);
        cookie.filter(|_| self.pick.set_cookie)
    }

    /// The server to try next after `outcome`, if the rules allow one (`buffered`: the
    /// request can be sent again as it was; `responded`: the client has a 1xx).
    fn next_pick(&mut self, outcome: Outcome, buffered: bool, responded: bool) -> Option<Pick> {
        let (target, u) = (self.x.target, self.x.target.upstream);
        let replay = Replay {
            idempotent: self.x.idempotent,
            buffered,
            responded,
        };
        if !may_retry(&u.retry.on, outcome, replay) {
            return None;
        }
        let upstreams = &self.x.worker.upstreams;
        upstreams.retry(
            target.upstream_index,
            target.pool,
            u,
            self.x.key,
            &self.tried,
        )
    }
}

/// The relayed try (beside what its sender left, [`Sender::Sent`]).
pub(crate) struct Accepted<'a> {
    /// Held until the response is relayed: the request counts as in flight on the server.
    pub pick: Pick,
    pub server: &'a UpstreamServer,
    pub metrics: Option<&'a ServerMetrics>,
    /// From the try's start to its final head.
    pub elapsed: Duration,
    /// When the final head arrived.
    pub head_at: Instant,
    pub(super) target: Target<'a>,
    pub(super) worker: &'a Worker,
}

impl<'a> Accepted<'a> {
    /// Counts the try as the client sees it, once: `Ok(status)` when its response is
    /// relayed, the error (the client's 502) when it is refused before any byte of it.
    pub fn count(&self, result: Result<u16, ProxyError>) {
        count(self.target, self.metrics, &self.pick, result, self.elapsed);
    }

    /// The sticky-session `Set-Cookie` line the response carries, if any.
    pub fn set_cookie(&self) -> Option<&'a [u8]> {
        let cookie = self.target.pool.set_cookie(self.pick.server);
        cookie.filter(|_| self.pick.set_cookie)
    }
}

/// Sends the request through `sender` to the server the load balancer picks, and to
/// others as the rules above allow, until a try is relayed (returned, after what its
/// sender left). `started`: the request's start (the first try's). Notes each try's server
/// in `last_try`, and its time when a final head came.
pub(crate) async fn drive<'a, S: Sender>(
    x: &'a Exchange<'a>,
    sender: &mut S,
    started: Instant,
    last_try: &mut LastTry,
) -> Result<(S::Sent, Accepted<'a>), Failure> {
    let (target, u) = (x.target, x.target.upstream);
    let pool = target.pool;
    let upstreams = &x.worker.upstreams;
    let picked = upstreams.pick(target.upstream_index, pool, u, x.key);
    let pick = picked.ok_or(ProxyError::NoServer)?;
    let mut tries = Tries {
        x,
        tried: Tried::new(pick.server),
        pick,
        next: None,
        head_at: None,
    };
    let mut started = started;
    loop {
        let server = &u.servers[tries.pick.server];
        let slot = pool.server_slots[tries.pick.server];
        let metrics = x.worker.metrics.server(pool.slot, slot);
        last_try.upstream_pick = Some((target.upstream_index, tries.pick.server));
        tries.head_at = None;
        let sent = on_server(sender, server, metrics, started, &mut tries).await;
        // When the final head came (else now): the pool's idle time starts there too, so
        // it is kept as it is rather than added back from `elapsed` (an `Instant` sum).
        let head_at = tries.head_at.unwrap_or_else(Instant::now);
        let elapsed = head_at.saturating_duration_since(started);
        last_try.upstream_time = tries.head_at.map(|_| elapsed);
        let miss = match sent {
            Ok(sent) => {
                let accepted = Accepted {
                    pick: tries.pick,
                    server,
                    metrics,
                    elapsed,
                    head_at,
                    target,
                    worker: x.worker,
                };
                return Ok((sent, accepted));
            }
            Err(miss) if miss.unsent => {
                // A request that cannot be sent fails on its first try: no server tried.
                *last_try = LastTry::default();
                return Err(miss.failure);
            }
            Err(miss) => miss,
        };
        let result = miss.retried.ok_or(miss.failure.error);
        let outcome = count(target, metrics, &tries.pick, result, elapsed);
        let next = match tries.next.take() {
            Some(next) => Some(next),
            None if miss.retried.is_some() => None,
            None => {
                let responded = sender.responded() || miss.failure.reached != Reached::Nothing;
                tries.next_pick(outcome, sender.replayable(), responded)
            }
        };
        let Some(next) = next else {
            return Err(miss.failure);
        };
        tracing::debug!(upstream = %u.name, server = %server.name, reason = outcome.reason(), "retrying on another server");
        tries.tried.push(next.server);
        if let Some(m) = x.worker.metrics.upstream(pool.slot) {
            m.retries.inc();
        }
        tries.pick = next;
        started = Instant::now();
    }
}

/// Tries `server`, again on new connections while it does not process the request.
async fn on_server<S: Sender>(
    sender: &mut S,
    server: &UpstreamServer,
    metrics: Option<&ServerMetrics>,
    started: Instant,
    tries: &mut Tries<'_>,
) -> Result<S::Sent, Miss> {
    let mut attempt = Attempt {
        server,
        metrics,
        started,
        fresh: false,
    };
    let mut left = MAX_UNPROCESSED;
    loop {
        left -= 1;
        if let Some(t) = tries.x.trace {
            t.begin_attempt(server, tries.x.target.upstream);
        }
        let sent = sender.send(&attempt, tries).await;
        if let Some(t) = tries.x.trace {
            t.end_attempt(attempt_end(&sent));
        }
        match sent {
            Err(miss) if miss.unprocessed && sender.replayable() && left > 0 => {
                tracing::debug!(server = %server.addr, error = %miss.failure.error, "not processed; again on that server");
                attempt.fresh = true;
            }
            sent => return sent,
        }
    }
}

/// How a try ended, for its client span.
fn attempt_end<T>(sent: &Result<T, Miss>) -> AttemptEnd {
    match sent {
        Ok(_) => AttemptEnd::Relayed,
        Err(miss) if miss.unsent => AttemptEnd::Unsent,
        Err(miss) => AttemptEnd::Failed {
            status: miss.retried,
            // A retried status is the error itself.
            error: match miss.retried {
                Some(_) => "",
                None => Outcome::of_error(miss.failure.error).reason(),
            },
        },
    }
}

/// Records a try's outcome: for the server's passive health and load balancing (`pick`),
/// and in the server's metrics (by the status it answered, or the one Weir answers for
/// it; tries the client broke off are not the server's doing).
fn count(
    target: Target<'_>,
    metrics: Option<&ServerMetrics>,
    pick: &Pick,
    result: Result<u16, ProxyError>,
    elapsed: Duration,
) -> Outcome {
    let outcome = Outcome::of(result);
    pick.record(target.pool, target.upstream, outcome, elapsed);
    let Some(m) = metrics else { return outcome };
    let status = match result {
        Ok(status) => {
            m.response.observe(elapsed);
            Some(status)
        }
        Err(error) => error.status(),
    };
    if let Some(status) = status {
        m.request(status).inc();
    }
    if outcome == Outcome::ConnectError {
        m.connect_errors.inc();
    }
    outcome
}
