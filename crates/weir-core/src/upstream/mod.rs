//! Upstream pools: choosing a server for a request.
//!
//! For now one policy, round robin, with its cursor kept per worker (no shared counter on
//! the request path). The upstream issue adds policies, health and retries here.

pub mod round_robin;
