//! Listening sockets: binding with SO_REUSEPORT (one socket per worker per listener) and
//! the accept loop with its connection limit and file-descriptor back-off.

mod accept;
mod bind;

pub use accept::accept_loop;
pub use bind::bind_reuseport;
