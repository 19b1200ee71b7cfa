//! The background thread of automatic certificates: once a second it looks at every
//! automatic certificate of the running snapshot, and for one that is missing or due
//! (two thirds into its lifetime) and not waiting out a back-off, it issues (internal CA)
//! or starts an ACME order as a task. One task per name set for the whole process, never
//! one per worker; a failure waits `retry_initial` doubled per failure in a row, jittered
//! by up to a quarter, at most an hour (a rate limit: at least an hour).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::acme::{self, Outcome};
use super::{shared, AutoCerts, Spec, ORDERS_FAILED, ORDERS_VALID};
use crate::tls::facts::unix_now;
use crate::worker::Shared;

/// How often the due dates are looked at.
const TICK: Duration = Duration::from_secs(1);
/// The longest back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The wait after a failure to issue from the internal CA.
const INTERNAL_RETRY: Duration = Duration::from_secs(60);
/// How long an instance waits for another that holds the fleet's lock of a certificate
/// of the internal CA before it looks again.
const FLEET_WAIT: Duration = Duration::from_secs(1);

/// Starts the thread; it ends at shutdown (an order in flight is abandoned).
pub fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    crate::server::spawn_with_runtime("weir-certs", move || run(shared))
}

async fn run(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        if *shutdown.borrow() {
            return;
        }
        for auto in in_use(&shared) {
            let now = unix_now();
            if auto.due(now) {
                start(auto);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            changed = shutdown.changed() => if changed.is_err() { return },
        }
    }
}

/// The automatic certificates of the running snapshot, each once.
fn in_use(shared: &Shared) -> Vec<Arc<AutoCerts>> {
    let snapshot = shared.snapshot.load();
    let mut seen = HashSet::new();
    snapshot
        .listeners
        .iter()
        .filter_map(|plan| plan.tls.as_ref()?.store.auto().cloned())
        .filter(|auto| seen.insert(Arc::as_ptr(auto)))
        .collect()
}

/// Obtains a certificate for `auto`: the internal CA at once, ACME as a task.
fn start(auto: Arc<AutoCerts>) {
    let acme = match &auto.spec {
        Spec::Internal { lifetime } if shared::get().is_some() => {
            let lifetime = *lifetime;
            return start_fleet_internal(auto, lifetime);
        }
        Spec::Internal { .. } => {
            // A panic must not end this thread: every certificate's renewal runs on it.
            let renewed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::renew_internal(&auto)
            }));
            match renewed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => auto.failed(format!("{e} (fix: {})", e.fix()), INTERNAL_RETRY),
                Err(_) => auto.failed("issuing panicked".to_owned(), INTERNAL_RETRY),
            }
            return;
        }
        Spec::Acme(acme) => acme.clone(),
    };
    let running = Running::start(auto.clone(), acme.retry_initial);
    tokio::spawn(async move {
        let _running = running;
        tracing::info!(names = %auto.names.join(","), directory = %acme.directory, "ACME order started");
        match acme::order(&auto, &acme).await {
            Ok(Outcome::Ordered) => {
                ORDERS_VALID.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Outcome::NotNeeded) => {
                // Another process orders: look again after a short wait, no failure counted.
                auto.wait(acme.retry_initial);
            }
            Err(e) => {
                ORDERS_FAILED.fetch_add(1, Ordering::Relaxed);
                let failures = auto.status().failures;
                let mut wait = backoff(acme.retry_initial, failures);
                if e.rate_limited {
                    wait = wait.max(MAX_BACKOFF);
                }
                auto.failed(e.explained(&acme), wait);
            }
        }
    });
}

/// Issues from the fleet's internal CA as a task (the store is reached over the network).
fn start_fleet_internal(auto: Arc<AutoCerts>, lifetime: Duration) {
    let Some(store) = shared::get() else { return };
    let running = Running::start(auto.clone(), INTERNAL_RETRY);
    tokio::spawn(async move {
        let _running = running;
        match shared::issue_internal(store.as_ref(), &auto, lifetime).await {
            Ok(true) => {}
            // Another instance issues: look again after a short wait, no failure counted.
            Ok(false) => auto.wait(FLEET_WAIT),
            Err(e) => auto.failed(e, INTERNAL_RETRY),
        }
    });
}

/// Marks an order running while it lives; dropped however the task ends (a panic too:
/// then it records the failure and backs off, so the name set is ordered again later).
struct Running {
    auto: Arc<AutoCerts>,
    retry_initial: Duration,
}

impl Running {
    fn start(auto: Arc<AutoCerts>, retry_initial: Duration) -> Running {
        auto.set_running(true);
        Running {
            auto,
            retry_initial,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            ORDERS_FAILED.fetch_add(1, Ordering::Relaxed);
            let wait = backoff(self.retry_initial, self.auto.status().failures);
            self.auto.failed("the order task panicked".to_owned(), wait);
        }
        self.auto.set_running(false);
    }
}

/// `initial` doubled `failures` times, at most [`MAX_BACKOFF`], plus up to a quarter more
/// at random (so processes that failed together do not retry together).
pub fn backoff(initial: Duration, failures: u32) -> Duration {
    let base = initial
        .saturating_mul(1u32.checked_shl(failures.min(20)).unwrap_or(u32::MAX))
        .min(MAX_BACKOFF);
    let mut byte = [0u8; 1];
    let _ = aws_lc_rs::rand::fill(&mut byte);
    base + base / 4 * u32::from(byte[0]) / 255
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_an_hour() {
        let s = Duration::from_secs;
        for (failures, low) in [(0, 10), (1, 20), (3, 80)] {
            let got = backoff(s(10), failures);
            assert!(
                got >= s(low) && got <= s(low) + s(low) / 4,
                "{failures}: {got:?}"
            );
        }
        let capped = backoff(s(10), 30);
        assert!(capped >= MAX_BACKOFF && capped <= MAX_BACKOFF + MAX_BACKOFF / 4);
    }

    #[tokio::test]
    async fn a_panicking_order_task_is_no_longer_running_and_backs_off() {
        let dir = std::env::temp_dir().join(format!("weir-running-{}", std::process::id()));
        let auto = Arc::new(super::super::tests::auto(&dir, &["a.test"]));
        let running = Running::start(auto.clone(), Duration::from_secs(1));
        assert!(auto.status().running);
        let task = tokio::spawn(async move {
            let _running = running;
            panic!("a bug in an order");
        });
        assert!(task.await.is_err(), "the task panicked");
        let status = auto.status();
        assert!(!status.running, "not left running forever");
        assert_eq!(status.failures, 1);
        assert!(status.retry_at.is_some());
        assert!(status.last_error.unwrap().contains("panicked"));
    }
}
