//! Request and response filters: one file per transformation the proxy applies to a head.
//!
//! Filters are pure functions over bytes; the forwarding code calls them while it writes the
//! upstream request head and the client response head.

pub mod basic_auth;
pub mod compression;
pub mod forwarded;
pub mod headers;
pub mod location;
pub mod rate_limit;
pub mod real_ip;
pub mod redirect;
pub mod request_id;
pub mod respond;
pub mod rewrite;
pub mod upgrade;
