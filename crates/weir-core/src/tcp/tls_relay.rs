//! The relay of a TCP listener whose upstream has `tls` (TLS origination): the client side
//! is plain TCP, read and written as in `relay`; the server side is a TLS stream, moved
//! through buffers (no splice: the bytes must be encrypted in user space). Half-close is
//! passed on (client FIN -> TLS close_notify and FIN; server close -> FIN to the client),
//! and `idle_timeout` and `fin_timeout` apply as for plain relays.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::io::{read_some, shutdown_write, write_all};
use super::relay::{End, RelayConfig};
use crate::buffer::Buffer;
use crate::connector::UpstreamStream;
use crate::idle::{self, Activity, Noted};
use crate::sys::{borrow_socket, unsent_total};
use crate::worker::Worker;

/// Relays until both directions end, one fails, or nothing moves for too long.
/// `to_server` holds client bytes to send first.
pub async fn relay_tls(
    worker: &Worker,
    client: &TcpStream,
    server: &mut UpstreamStream,
    mut to_server: Buffer,
    config: &RelayConfig<'_>,
) -> End {
    let activity = Activity::new();
    let mut back = worker.take_buffer_sized(to_server.capacity());
    let server_fd = server.tcp().as_raw_fd();
    // SAFETY: `server` owns the socket and is borrowed for this whole function, which
    // outlives the relay and its probe: the descriptor stays open.
    #[allow(unsafe_code)]
    let server_socket = unsafe { borrow_socket(server_fd) };
    let (mut server_read, mut server_write) = server.split();
    // Writes into the TLS stream and its flushes count as progress (see `idle::Noted`).
    let mut server_write = Noted {
        stream: &mut server_write,
        activity: &activity,
    };
    let up = async {
        loop {
            if !to_server.is_empty() {
                write_buffered(&mut server_write, &mut to_server).await?;
            }
            let n = read_some(client, &mut to_server).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            config.bytes_in.add(n as u64);
            activity.touch();
        }
    };
    let down = async {
        loop {
            let n = back.read_from(&mut server_read).await?;
            if n == 0 {
                shutdown_write(client);
                return Ok::<_, io::Error>(());
            }
            config.bytes_out.add(n as u64);
            activity.touch();
            write_all(client, &mut back, &activity).await?;
        }
    };
    // The unsent bytes of both sockets: a slow client drains its queue while `write_all`
    // waits, a slow TLS server its own while a write into the TLS stream waits for room
    // (which shows no progress until the kernel frees about a third of the send buffer).
    let sockets = [Some(client.as_fd()), server_socket];
    let probe = || unsent_total(&sockets);
    let both = idle::both_probed(up, down, &activity, config.limits, probe);
    let end = End::from(both.await);
    worker.give_buffer(to_server);
    worker.give_buffer(back);
    end
}

/// Writes and flushes everything in `buf` (TLS records go out whole).
async fn write_buffered<W: AsyncWrite + Unpin>(w: &mut W, buf: &mut Buffer) -> io::Result<()> {
    w.write_all(buf.filled()).await?;
    buf.clear();
    w.flush().await
}
