//! TLS offload on a TCP listener with `[listeners.tls]`: the client's TLS is terminated
//! (the same certificate store, handshake limits and metrics as HTTP listeners,
//! `tls::handshake`), the upstream is chosen (with `sni_routes`, by the SNI name the
//! handshake settled), and the plaintext is relayed to the server, or re-encrypted when
//! the upstream has `tls`. Both sides go through buffers: there is no splice, since the
//! client's bytes are decrypted in user space.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use weir_config::{Listener, TcpSettings};

use super::relay::{End, RelayConfig};
use crate::buffer::Buffer;
use crate::client_stream::ClientStream;
use crate::connector::UpstreamStream;
use crate::idle::{self, Activity, Noted};
use crate::metrics::shard::Counter;
use crate::sys::{borrow_socket, unsent_total};
use crate::tcp::sni::{self, SniResult};
use crate::tls::session::TlsSession;
use crate::tls::ListenerTls;
use crate::worker::Worker;

/// Runs the handshake on `client` (a connection of listener `at`);
/// `buf` holds bytes read already (after a PROXY header). `None`: the connection closes
/// (counted by `tls::handshake`).
pub async fn terminate(
    worker: &Worker,
    at: crate::listener::Slot<'_>,
    tls: &ListenerTls,
    client: tokio::net::TcpStream,
    buf: &mut Buffer,
) -> Option<(ClientStream, TlsSession)> {
    let mut stream = ClientStream::from_registered(client);
    let session = crate::tls::handshake::accept(worker, at, tls, &mut stream, buf);
    let session = session.await?;
    Some((stream, session))
}

/// The upstream for a terminated connection: the listener's, or with `sni_routes` the one
/// the handshake's SNI name picks (counted in `weir_tcp_sni_total` like a preread).
pub fn choose_upstream(
    worker: &Worker,
    slot: usize,
    tcp: &TcpSettings,
    session: &TlsSession,
) -> usize {
    if tcp.sni_routes.is_empty() {
        return tcp.upstream;
    }
    let (upstream, result) = match session.sni.as_deref() {
        None => (tcp.upstream, SniResult::NoSni),
        Some(name) => match sni::route(&tcp.sni_routes, name.as_bytes()) {
            Some(upstream) => (upstream, SniResult::Matched),
            None => (tcp.upstream, SniResult::UnknownSni),
        },
    };
    if let Some(m) = worker.metrics.listener(slot) {
        m.sni[result as usize].inc();
    }
    upstream
}

/// The client's local address (for a PROXY header sent on), read before the socket moves
/// into the TLS stream.
pub fn local_addr(client: &tokio::net::TcpStream, listener: &Listener) -> SocketAddr {
    client.local_addr().unwrap_or(listener.first_addr())
}

/// Relays between the terminated client and `server` until both directions end, one
/// fails, or nothing moves for too long (`idle_timeout`, `fin_timeout`). Half-close is passed on both ways (a
/// client's close_notify or FIN shuts the server's write side, and the other way round).
pub async fn relay(
    worker: &Worker,
    client: &mut ClientStream,
    server: &mut UpstreamStream,
    mut to_server: Buffer,
    config: &RelayConfig<'_>,
) -> End {
    let activity = Activity::new();
    let mut to_client = worker.take_buffer_sized(to_server.capacity());
    let fds = [client.raw_fd(), server.tcp().as_raw_fd()];
    // SAFETY: `client` and `server` own these sockets (under their TLS streams) and are
    // borrowed for this whole function, which outlives the relay and its probe.
    #[allow(unsafe_code)]
    let sockets = unsafe { fds.map(|fd| borrow_socket(fd)) };
    // The unsent bytes of both sockets under the TLS streams: a blocked TLS write shows
    // no progress until the kernel frees about a third of the send buffer, a slow reader's queue
    // shrinks meanwhile (see `idle::both_probed`).
    let probe = || unsent_total(&sockets);
    let end = match client.split() {
        Ok((mut client_read, mut client_write)) => {
            let (mut server_read, mut server_write) = server.split();
            // Writes and flushes count as progress: a slow reader keeps the relay open.
            let mut server_write = Noted {
                stream: &mut server_write,
                activity: &activity,
            };
            let mut client_write = Noted {
                stream: &mut client_write,
                activity: &activity,
            };
            let up = pump(
                &mut client_read,
                &mut server_write,
                &mut to_server,
                config.bytes_in,
                &activity,
            );
            let down = pump(
                &mut server_read,
                &mut client_write,
                &mut to_client,
                config.bytes_out,
                &activity,
            );
            End::from(idle::both_probed(up, down, &activity, config.limits, probe).await)
        }
        Err(_) => End::Error,
    };
    worker.give_buffer(to_server);
    worker.give_buffer(to_client);
    end
}

/// Copies `from` to `to` through `buf` (whose bytes go first) until `from` ends, then
/// shuts `to`'s write side. Every write is flushed: TLS records go out whole.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    buf: &mut Buffer,
    counter: &Counter,
    activity: &Activity,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        if !buf.is_empty() {
            to.write_all(buf.filled()).await?;
            buf.clear();
            to.flush().await?;
        }
        let n = match buf.read_from(from).await {
            Ok(n) => n,
            // A TLS client that closed its socket without close_notify: passed on as the
            // end of its stream (a FIN to the server), as for a plain TCP client. The
            // plaintext protocol inside, not TLS, says whether the data was complete.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return to.shutdown().await;
        }
        counter.add(n as u64);
        activity.touch();
    }
}
