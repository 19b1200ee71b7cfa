//! The two-way tunnel after `101 Switching Protocols` (WebSocket and friends), bounded by
//! the listener's `tunnel_idle_timeout` and `tunnel_fin_timeout` (see `crate::idle`).

use weir_config::Listener;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use std::os::fd::RawFd;

use crate::buffer::Buffer;
use crate::idle::{self, Activity, End, Limits, Noted};
use crate::sys::{borrow_socket, unsent_total};

/// The still-time bounds of `listener`'s tunnels.
pub fn limits(listener: &Listener) -> Limits {
    Limits {
        idle: listener.tunnel_idle_timeout,
        fin: listener.tunnel_fin_timeout,
        min_progress: listener.tunnel_min_progress,
    }
}

/// Relays bytes both ways until both sides closed, one failed, or the tunnel was still
/// too long. Bytes that arrived early (after the request head from the client, after the
/// 101 head from the upstream) are sent first. An end of stream on one side is passed on
/// as a half-close to the other (`copy_bidirectional`). `sockets`: the descriptors of
/// both, whose unsent bytes the still-time watch compares (see `idle::both_probed`).
pub async fn run<C, U>(
    client: &mut C,
    client_early: &mut Buffer,
    upstream: &mut U,
    upstream_early: &mut Buffer,
    limits: Limits,
    sockets: [RawFd; 2],
) -> End
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let relay = async {
        // Nothing early: `write_all` of nothing returns at once, writing nothing.
        client.write_all(upstream_early.filled()).await?;
        upstream_early.clear();
        upstream.write_all(client_early.filled()).await?;
        client_early.clear();
        let mut client = Noted {
            stream: client,
            activity: &activity,
        };
        let mut upstream = Noted {
            stream: upstream,
            activity: &activity,
        };
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        Ok::<_, std::io::Error>(())
    };
    // SAFETY: `client` and `upstream` own these sockets (the one caller,
    // `forward::exchange`, takes them from these streams after registering the client, so
    // no state change can close it) and are borrowed for this whole function, which
    // outlives the relay and its probe: the descriptors stay open.
    #[allow(unsafe_code)]
    let sockets = unsafe { sockets.map(|fd| borrow_socket(fd)) };
    let probe = || unsent_total(&sockets);
    End::from(idle::one_probed(relay, &activity, limits, probe).await)
}
