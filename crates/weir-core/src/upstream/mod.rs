//! Upstream pools: choosing a server, keeping track of server health, and retrying.
//!
//! - `pool`: [`UpstreamPlan`], the per-upstream part of a snapshot (groups, hash rings,
//!   sticky ids, the shared per-server [`state::ServerState`])
//! - `lb/`: the policies, one pure unit per file
//! - `select`: availability (health, ejection, `max_connections`), primary vs backup
//!   groups, and dispatch to the policy
//! - `local`: per-worker state ([`WorkerUpstreams`]) and the [`Pick`] of one attempt
//! - `key`: what the request contributes (hash key, sticky cookie)
//! - `retry`: attempt outcomes, when a retry is safe, the retry budget
//! - `health/`: active checks on their own thread, rise/fall counters
//!
//! The request path reads shared state only with relaxed atomic loads (health verdicts,
//! ejection markers); everything it writes per request is worker-local.

pub mod health;
pub mod key;
pub mod lb;
pub mod local;
pub mod pool;
pub mod retry;
pub mod select;
pub mod split;
pub mod state;

pub use key::RequestKey;
pub use local::{Pick, WorkerUpstreams};
pub use pool::UpstreamPlan;

/// Builds the one upstream `u` described by `toml` (the keys of `[upstreams.u]`).
#[cfg(test)]
pub(crate) fn test_upstream(toml: &str) -> weir_config::Upstream {
    let text =
        format!("[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n[upstreams.u]\n{toml}");
    let mut config = weir_config::parse_str(&text, "t").expect("valid config");
    config.upstreams.remove(0)
}
