//! The two-way tunnel after `101 Switching Protocols` (WebSocket and friends), bounded by
//! the listener's `tunnel_idle_timeout` and `tunnel_fin_timeout` (see `crate::idle`).

use weir_config::Listener;

use crate::buffer::Buffer;
use crate::client_stream::ClientStream;
use crate::connector::UpstreamStream;
use crate::idle::{self, pump, Activity, End, Limits};

/// The still-time bounds of `listener`'s tunnels.
pub fn limits(listener: &Listener) -> Limits {
    Limits {
        idle: listener.tunnel_idle_timeout,
        fin: listener.tunnel_fin_timeout,
    }
}

/// Relays bytes both ways until both sides closed, one failed, or the tunnel was still
/// too long. Bytes that arrived early (after the request head from the client, after the
/// 101 head from the upstream) are sent first. An end of stream on one side is passed on
/// as a half-close to the other.
pub async fn run(
    client: &mut ClientStream,
    client_early: &mut Buffer,
    upstream: &mut UpstreamStream,
    upstream_early: &mut Buffer,
    limits: Limits,
) -> End {
    let Ok((mut client_read, mut client_write)) = client.split() else {
        return End::Error;
    };
    let (mut up_read, mut up_write) = upstream.split();
    let activity = Activity::new();
    let to_up = pump(
        &mut client_read,
        &mut up_write,
        client_early,
        None,
        &activity,
    );
    let to_client = pump(
        &mut up_read,
        &mut client_write,
        upstream_early,
        None,
        &activity,
    );
    End::from(idle::both(to_up, to_client, &activity, limits).await)
}
