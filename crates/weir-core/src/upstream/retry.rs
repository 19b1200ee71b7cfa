//! Retries: what an attempt's outcome was, whether it may be retried on another server,
//! and the per-worker retry budget that keeps an outage from multiplying load.
//!
//! Safety rules (`may_retry`):
//! - a connect failure (nothing was sent) may always be retried;
//! - a reset, early close or response timeout before any response byte, or a retryable
//!   status, only for an idempotent method whose whole request is still buffered (so the
//!   replay is byte-identical and the client has seen nothing);
//! - a non-idempotent request is never replayed once its head may have reached a server.

use weir_config::RetryOn;

use crate::error::ProxyError;

/// How one attempt on one server ended, as far as health and retries care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The connection could not be opened (refused, unreachable, connect timeout).
    ConnectError,
    /// Reset or closed before a complete response head.
    Reset,
    /// No response head within `response_timeout`.
    Timeout,
    /// The response head was not valid HTTP.
    Malformed,
    /// A response head with this status arrived.
    Status(u16),
    /// A TCP (L4) connection to the server was opened: a success for health and latency.
    Connected,
    /// The client side failed (left, too slow, bad body): says nothing about the server.
    Client,
    /// Weir had no descriptor, local port or socket memory for a connection: the server
    /// was never asked, so nothing counts against it, and no other server would fare better.
    Local,
}

impl Outcome {
    /// The outcome of a try that got a head with this status, or failed with this error.
    pub fn of(result: Result<u16, ProxyError>) -> Outcome {
        match result {
            Ok(status) => Outcome::Status(status),
            Err(error) => Outcome::of_error(error),
        }
    }

    pub fn of_error(error: ProxyError) -> Outcome {
        use ProxyError::*;
        match error {
            UpstreamConnect(_) | UpstreamConnectTimeout | UpstreamTls(_) => Outcome::ConnectError,
            UpstreamClosed | UpstreamIo(_) => Outcome::Reset,
            UpstreamTimeout => Outcome::Timeout,
            UpstreamMalformed(_) => Outcome::Malformed,
            // The client's request provoked that answer: nothing against the server.
            UpgradeNotMade(_) | UpstreamHeadTooLarge => Outcome::Client,
            // Weir's own shortage (descriptors, ports): the server was never asked.
            LocalResources(_) => Outcome::Local,
            _ => Outcome::Client,
        }
    }

    /// Counts against the server (passive ejection): connection failures, timeouts,
    /// malformed responses, and the statuses the pool retries (`on`: what nginx's
    /// `proxy_next_upstream` calls an unsuccessful attempt). A status the pool does not
    /// retry is the application's answer: counting it would let any client eject a
    /// healthy server with one request to a URL the application answers 503 (attacker
    /// review).
    pub fn is_server_failure(self, on: &RetryOn) -> bool {
        match self {
            Outcome::ConnectError | Outcome::Reset | Outcome::Timeout | Outcome::Malformed => true,
            Outcome::Status(s) => on.statuses.contains(&s),
            Outcome::Connected | Outcome::Client | Outcome::Local => false,
        }
    }

    /// A label for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Outcome::ConnectError => "connect error",
            Outcome::Reset => "reset before response",
            Outcome::Timeout => "response timeout",
            Outcome::Malformed => "malformed response",
            Outcome::Status(502) => "status 502",
            Outcome::Status(503) => "status 503",
            Outcome::Status(504) => "status 504",
            Outcome::Status(_) => "status",
            Outcome::Connected => "connected",
            Outcome::Client => "client error",
            Outcome::Local => "local resources",
        }
    }
}

/// What is known about the request when an attempt fails.
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub idempotent: bool,
    /// The whole request (head and body) is still in the buffer: a replay sends the same
    /// bytes.
    pub buffered: bool,
    /// The client has response bytes (a relayed 1xx).
    pub responded: bool,
}

/// Whether `outcome` may be retried on another server under `on`.
pub fn may_retry(on: &RetryOn, outcome: Outcome, r: Replay) -> bool {
    if r.responded {
        return false;
    }
    let replayable = r.idempotent && r.buffered;
    match outcome {
        Outcome::ConnectError => on.connect_error,
        Outcome::Reset => on.reset_before_response && replayable,
        Outcome::Timeout => on.timeout && replayable,
        Outcome::Status(s) => replayable && on.statuses.contains(&s),
        Outcome::Malformed | Outcome::Connected | Outcome::Client | Outcome::Local => false,
    }
}

/// Most retries a budget saves up (per worker and upstream).
pub const BUDGET_BURST: u32 = 10;
const MILLI: u32 = 1000;

/// A token bucket: each request adds `percent`/100 of a retry, each retry takes one,
/// saved up to [`BUDGET_BURST`]. Starts full so a fresh worker can absorb a failure.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    milli: u32,
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget {
            milli: BUDGET_BURST * MILLI,
        }
    }
}

impl RetryBudget {
    pub fn deposit(&mut self, percent: u32) {
        self.milli = (self.milli + percent * MILLI / 100).min(BUDGET_BURST * MILLI);
    }

    /// Whether a retry could be paid for now.
    pub fn has_token(&self) -> bool {
        self.milli >= MILLI
    }

    pub fn withdraw(&mut self) -> bool {
        if self.milli < MILLI {
            return false;
        }
        self.milli -= MILLI;
        true
    }
}

/// The servers a request has tried, in order (at most `attempts + 1`).
#[derive(Debug, Clone, Copy)]
pub struct Tried {
    servers: [usize; MAX_TRIED],
    len: usize,
}

const MAX_TRIED: usize = 11;

impl Tried {
    pub fn new(first: usize) -> Tried {
        let mut servers = [0; MAX_TRIED];
        servers[0] = first;
        Tried { servers, len: 1 }
    }

    pub fn push(&mut self, server: usize) {
        if self.len < MAX_TRIED {
            self.servers[self.len] = server;
            self.len += 1;
        }
    }

    pub fn as_slice(&self) -> &[usize] {
        &self.servers[..self.len]
    }

    /// Retries done so far.
    pub fn retries(&self) -> u32 {
        self.len as u32 - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn on(list: &[&str]) -> RetryOn {
        let mut on = RetryOn::default();
        for item in list {
            match *item {
                "connect_error" => on.connect_error = true,
                "reset_before_response" => on.reset_before_response = true,
                "timeout" => on.timeout = true,
                s => on.statuses.push(s.parse().unwrap()),
            }
        }
        on
    }

    const GET: Replay = Replay {
        idempotent: true,
        buffered: true,
        responded: false,
    };
    const POST: Replay = Replay {
        idempotent: false,
        ..GET
    };

    #[test]
    fn classification() {
        let refused = ProxyError::UpstreamConnect(ErrorKind::ConnectionRefused);
        assert_eq!(Outcome::of_error(refused), Outcome::ConnectError);
        let no_fds = Outcome::of_error(ProxyError::LocalResources("fds"));
        assert_eq!(no_fds, Outcome::Local);
        let on = RetryOn::default();
        assert!(!no_fds.is_server_failure(&on));
        assert!(!may_retry(&RetryOn::default(), no_fds, GET));
        assert_eq!(
            Outcome::of_error(ProxyError::UpstreamClosed),
            Outcome::Reset
        );
        assert_eq!(
            Outcome::of_error(ProxyError::UpstreamIo(ErrorKind::ConnectionReset)),
            Outcome::Reset
        );
        assert_eq!(Outcome::of_error(ProxyError::ClientClosed), Outcome::Client);
        let unswitched = Outcome::of_error(ProxyError::UpgradeNotMade("x"));
        assert!(!unswitched.is_server_failure(&on));
        assert!(!Outcome::Status(503).is_server_failure(&on), "not retried");
        let on_503 = RetryOn {
            statuses: vec![503],
            ..RetryOn::default()
        };
        assert!(Outcome::Status(503).is_server_failure(&on_503));
        assert!(!Outcome::Status(502).is_server_failure(&on_503));
        assert!(!Outcome::Status(200).is_server_failure(&on_503));
        assert!(!Outcome::Client.is_server_failure(&on_503));
        assert!(Outcome::Malformed.is_server_failure(&on));
    }

    #[test]
    fn connect_errors_retry_for_any_method() {
        let on = on(&["connect_error"]);
        assert!(may_retry(&on, Outcome::ConnectError, GET));
        assert!(may_retry(&on, Outcome::ConnectError, POST));
        let streaming = Replay {
            buffered: false,
            ..POST
        };
        assert!(may_retry(&on, Outcome::ConnectError, streaming));
        assert!(!may_retry(&RetryOn::default(), Outcome::ConnectError, GET));
    }

    #[test]
    fn a_sent_non_idempotent_request_is_never_replayed() {
        let on = on(&[
            "connect_error",
            "reset_before_response",
            "timeout",
            "502",
            "503",
        ]);
        for outcome in [Outcome::Reset, Outcome::Timeout, Outcome::Status(503)] {
            assert!(may_retry(&on, outcome, GET), "{outcome:?}");
            assert!(!may_retry(&on, outcome, POST), "{outcome:?}");
            let streamed = Replay {
                buffered: false,
                ..GET
            };
            assert!(!may_retry(&on, outcome, streamed), "{outcome:?}");
            let responded = Replay {
                responded: true,
                ..GET
            };
            assert!(!may_retry(&on, outcome, responded), "{outcome:?}");
        }
        assert!(!may_retry(&on, Outcome::Status(504), GET), "not listed");
        assert!(!may_retry(&on, Outcome::Malformed, GET));
    }

    #[test]
    fn budget_allows_a_fifth_of_requests_after_the_burst() {
        let mut b = RetryBudget::default();
        let burst = (0..100).take_while(|_| b.withdraw()).count();
        assert_eq!(burst, BUDGET_BURST as usize);
        let mut retried = 0;
        for _ in 0..1000 {
            b.deposit(20);
            if b.withdraw() {
                retried += 1;
            }
        }
        assert_eq!(retried, 200);
    }

    #[test]
    fn tried_servers() {
        let mut t = Tried::new(2);
        t.push(0);
        assert_eq!(t.as_slice(), &[2, 0]);
        assert_eq!(t.retries(), 1);
    }
}
