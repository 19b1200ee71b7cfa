//! The two-way tunnel after `101 Switching Protocols` (WebSocket and friends).

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::buffer::Buffer;

/// Relays bytes both ways until either side closes. Bytes that arrived early (after the
/// request head from the client, after the 101 head from the upstream) are sent first.
pub async fn run<C: AsyncRead + AsyncWrite + Unpin, U: AsyncRead + AsyncWrite + Unpin>(
    client: &mut C,
    client_early: &mut Buffer,
    upstream: &mut U,
    upstream_early: &mut Buffer,
) {
    if !upstream_early.is_empty() && client.write_all(upstream_early.filled()).await.is_err() {
        return;
    }
    upstream_early.clear();
    if !client_early.is_empty() && upstream.write_all(client_early.filled()).await.is_err() {
        return;
    }
    client_early.clear();
    let _ = tokio::io::copy_bidirectional(client, upstream).await;
}
