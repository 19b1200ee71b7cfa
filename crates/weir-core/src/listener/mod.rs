//! Listening sockets: binding with SO_REUSEPORT (one socket per worker per listener) and
//! the accept loop with its connection limit and file-descriptor back-off, and the PROXY
//! protocol check of accepted connections.

mod accept;
mod bind;
pub mod proxy_protocol;

pub use accept::accept_loop;
pub use bind::bind_reuseport;
