//! Listening sockets: binding with SO_REUSEPORT (one socket per worker per listener) and
//! the accept loop with its connection limit (`cap`, counted once per listener across the
//! workers; at the cap idle connections give way to new ones, `reclaim`) and
//! file-descriptor back-off (`backoff`, shared with the admin listener), the
//! PROXY protocol check of accepted connections, and the per-worker task that starts and
//! stops accept loops when the config changes.

mod accept;
pub mod backoff;
mod bind;
pub mod cap;
pub mod control;
mod holder;
pub mod proxy_protocol;
pub(crate) mod reclaim;

pub use accept::accept_loop;
pub use bind::{bind_reuseport, bind_unlistened, listen, set_defer_accept};
pub use control::{control_loop, Command, StopSignal};
pub use holder::refuse_foreign_listener;

/// The bind of a listener that a connection arrived on: the listener's metric slot, and
/// whether it is the plain-HTTP bind (`http_bind`) of a TLS listener, whose connections
/// skip the handshake.
#[derive(Clone, Copy, Debug)]
pub struct BindSlot {
    pub slot: usize,
    pub plain_http: bool,
}

/// A listener as a connection's code sees it: its configuration and its metric slot.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    /// The listener's metric slot (`Metrics::listener`).
    pub slot: usize,
    pub listener: &'a weir_config::Listener,
}
