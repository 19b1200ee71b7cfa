//! WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with `:protocol = websocket`
//! bridged to an HTTP/1.1 Upgrade request upstream, then a tunnel.
//!
//! `request::write_upgrade_head` turned the CONNECT into `GET` + `Upgrade: websocket` with
//! a `Sec-WebSocket-Key` made here, so routing, filters and `forward::request_head` treat
//! it as an HTTP/1.1 upgrade (the route's `upgrades` must list `websocket`). The upstream
//! must answer 101 switching to `websocket` with the `Sec-WebSocket-Accept` of that key
//! (RFC 6455 4.2.2), else 502; another 2xx is a 502 too, any other answer goes back to the
//! client with its fields and body. After it the client gets 200 (with the 101's
//! end-to-end fields) and bytes flow both ways: client DATA is released to its window
//! only once written upstream, upstream bytes go out as DATA within the client's window
//! (one buffer, bounded by `max_send_buffer` in `h2`), END_STREAM and the upstream's EOF
//! close each direction, and a reset on either side ends both. The listener's
//! `tunnel_idle_timeout` and `tunnel_fin_timeout` bound a still tunnel (`crate::idle`).

use std::time::Duration;

use aws_lc_rs::digest;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::exchange::StreamRequest;
use super::respond::head_from_http1;
use super::send::{send_bytes, unless_reset, Stop};
use crate::buffer::Buffer;
use crate::codec::http1::header::field;
use crate::codec::http1::ResponseHead;
use crate::connector::UpstreamStream;
use crate::error::ProxyError;
use crate::filters::upgrade::{switch_allowed, Offered};
use crate::forward::h1::Http1Response;
use crate::forward::tunnel::limits;
use crate::forward::Failure;
use crate::idle::{Activity, Cut, End, Limits, Noted};
use crate::request::Trace;
use crate::worker::UPSTREAM_BUFFER;

/// RFC 6455 section 1.3.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64.
pub fn new_key() -> [u8; 24] {
    let mut raw = [0u8; 16];
    // The key is a nonce against caches that do not know WebSocket, not a secret: should
    // the system's random source fail, the time still makes it unique enough.
    if aws_lc_rs::rand::fill(&mut raw).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        raw = t.to_le_bytes();
    }
    let mut out = [0u8; 24];
    // Sized for the padded encoding (4 bytes for each 3, rounded up): it cannot fail.
    let _ = STANDARD.encode_slice(raw, &mut out);
    out
}

/// The `Sec-WebSocket-Accept` a server must answer `key` with.
pub fn accept_of(key: &[u8]) -> [u8; 28] {
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(GUID);
    let mut out = [0u8; 28];
    let _ = STANDARD.encode_slice(ctx.finish(), &mut out);
    out
}

impl StreamRequest<'_> {
    /// Opens the WebSocket upstream for an extended CONNECT whose head (with `key`) is
    /// `self.req`, answers 200 and tunnels until both sides are done. A tunnel is rare and
    /// long: its upstream buffer is its own, not one of the worker's spares.
    pub async fn forward_websocket(
        &self,
        body: RecvStream,
        respond: &mut SendResponse<Bytes>,
        key: &[u8],
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let up_buf = &mut Buffer::new(UPSTREAM_BUFFER);
        let resp = &mut ResponseHead::default();
        let (x, started) = (self.exchange_of(), std::time::Instant::now());
        // The client waits for the 101 (as 200) only: 1xx heads before it are dropped.
        let open = self.try_alone(&x, Some(key), up_buf, resp, started, &mut trace.last_try);
        let (mut stream, _, accepted) = match unless_reset(|cx| respond.poll_reset(cx), open).await
        {
            Ok(opened) => opened?,
            Err(stop) => return Err(stop.noted(trace).into()),
        };
        let mut lines = Vec::new();
        let edits = self.edits(&mut lines, accepted.server);
        if resp.status != 101 {
            // The upstream refused the upgrade (a final status other than 101 and 2xx):
            // the refusal goes to the client as any response would, with its fields and
            // body (`WWW-Authenticate` of a 401, `Location` of a redirect). The try was
            // counted when its head came (`try_alone`).
            let up = Http1Response {
                stream: &mut stream,
                buf: up_buf,
                head: resp,
            };
            let relayed = self.respond_http1(respond, up, edits, |_| {}, trace);
            return relayed.await.map(|_| ());
        }
        // The 200 to the client, with the end-to-end fields of the 101 (the subprotocol
        // and extensions the server chose, cookies, ...) but `Sec-WebSocket-Accept`, which
        // answered Weir's key.
        let arrived = Bytes::copy_from_slice(up_buf.filled());
        let mut head = head_from_http1(resp, &arrived, &edits, http::HeaderMap::new());
        *head.status_mut() = http::StatusCode::OK;
        head.headers_mut().remove("sec-websocket-accept");
        up_buf.consume(resp.head_len);
        trace.status = 200;
        let mut send = respond
            .send_response(head, false)
            .map_err(|_| Failure::after_head(ProxyError::ClientClosed))?;
        let listener = self.target.listener;
        let (stall, limits) = (listener.http2.stall_timeout, limits(listener));
        let result = tunnel(&mut send, body, stream, up_buf, stall, limits, trace).await;
        crate::idle::count(self.worker, self.target.listener_slot, End::from(result));
        let ended = match result {
            Ok(()) => return Ok(()),
            // A reset is how a client closes an established tunnel (RFC 8441 section 5):
            // no cancelled request, so nothing for the reset budget (`trace.reset`).
            Err(Cut::Failed(Stop::Reset)) => {
                return Err(Failure::after_head(ProxyError::ClientClosed))
            }
            // Still too long: neither side is at fault, the tunnel just ends (as over
            // HTTP/1.1), counted in `weir_tunnel_timeouts_total`, not as an aborted response.
            Err(Cut::Idle | Cut::Fin) => Ok(()),
            Err(Cut::Failed(Stop::Error(e))) => Err(e),
        };
        send.send_reset(Reason::CANCEL);
        ended.map_err(Failure::after_head)
    }
}

/// Checks that an extended CONNECT's Upgrade request was answered as a WebSocket server
/// must (`resp`, parsed from `buf`; `offered`: the upgrade the head offered): a 101 must switch
/// to an allowed protocol with the `Sec-WebSocket-Accept` of `key`, and another 2xx is no
/// answer at all (the upstream is no WebSocket server); any other status is a refusal the
/// client gets.
/// The failures are the client's (`UpgradeNotMade`): it picked a path whose server is no
/// WebSocket server, which must not count against that server's health.
pub(super) fn check_handshake_answer(
    r: &StreamRequest<'_>,
    key: &[u8],
    offered: Offered,
    resp: &ResponseHead,
    buf: &[u8],
) -> Result<(), ProxyError> {
    let not_made = |why| Err(ProxyError::UpgradeNotMade(why));
    if (200..300).contains(&resp.status) {
        return not_made("2xx answer to a WebSocket upgrade");
    }
    if resp.status != 101 {
        return Ok(());
    }
    let allowed = &r.target.route.upgrades;
    let accept = field(&resp.headers, buf, b"sec-websocket-accept");
    if !switch_allowed(&resp.headers, buf, allowed, offered) || accept != Some(&accept_of(key)[..])
    {
        return not_made("WebSocket handshake not accepted");
    }
    Ok(())
}

/// Relays both ways until each side has ended its direction (client END_STREAM, upstream
/// EOF), one fails, or the tunnel is still for longer than `limits` allow (the client's
/// window closed for longer than `stall`).
async fn tunnel(
    send: &mut SendStream<Bytes>,
    mut body: RecvStream,
    stream: UpstreamStream,
    up_buf: &mut Buffer,
    stall: Duration,
    limits: Limits,
    trace: &mut Trace,
) -> Result<(), Cut<Stop>> {
    // The upstream's unsent bytes: a slow upstream reader drains them while a write
    // waits for room (see `idle::both_probed`; the client side is paced by its window).
    let fd = std::os::fd::AsRawFd::as_raw_fd(stream.tcp());
    // SAFETY: the split halves below own `stream` and live until the end of this
    // function, after the relay and its probe: the descriptor stays open.
    #[allow(unsafe_code)]
    let socket = unsafe { crate::sys::borrow_socket(fd) };
    let (mut ur, mut uw) = tokio::io::split(stream);
    let mut sent = 0u64;
    let mut received = 0u64;
    let activity = Activity::new();
    let result = {
        let down = downstream(send, &mut ur, up_buf, stall, &mut sent, &activity);
        let up = upstream(&mut body, &mut uw, &mut received, &activity);
        let probe = || crate::sys::unsent_total(&[socket]);
        crate::idle::both_probed(down, up, &activity, limits, probe).await
    };
    trace.body_in = received;
    trace.body_out = sent;
    result
}

/// Upstream bytes to the client as DATA, within its window; END_STREAM at the upstream's
/// EOF.
async fn downstream<R: AsyncRead + Unpin>(
    send: &mut SendStream<Bytes>,
    ur: &mut R,
    up_buf: &mut Buffer,
    stall: Duration,
    sent: &mut u64,
    activity: &Activity,
) -> Result<(), Stop> {
    loop {
        if !up_buf.is_empty() {
            send_bytes(send, Bytes::copy_from_slice(up_buf.filled()), false, stall).await?;
            *sent += up_buf.len() as u64;
            up_buf.clear();
            // Sent within the client's window: progress even if the client reads slowly.
            activity.touch();
        }
        match unless_reset(|cx| send.poll_reset(cx), up_buf.read_from(ur)).await? {
            Ok(0) => return send_bytes(send, Bytes::new(), true, stall).await,
            Ok(_) => activity.touch(),
            Err(e) => return Err(Stop::Error(ProxyError::upstream_io(e))),
        }
    }
}

/// Client DATA to the upstream, released to the client's window once written; the
/// upstream's write half is shut at the client's END_STREAM.
async fn upstream<W: AsyncWrite + Unpin>(
    body: &mut RecvStream,
    uw: &mut W,
    received: &mut u64,
    activity: &Activity,
) -> Result<(), Stop> {
    // Each write that moves bytes counts: an upstream reading slowly is not still.
    let mut uw = Noted {
        stream: uw,
        activity,
    };
    while let Some(data) = body.data().await {
        // An error here is the client's reset (or the connection's end).
        let data = data.map_err(|_| Stop::Reset)?;
        activity.touch();
        // Flushed: a TLS upstream may hold the tail back when its socket was full, and the
        // next write may be long in coming (the peer may be waiting for this message).
        let written = async {
            uw.write_all(&data).await?;
            uw.flush().await
        };
        written
            .await
            .map_err(|e| Stop::Error(ProxyError::upstream_io(e)))?;
        *received += data.len() as u64;
        let _ = body.flow_control().release_capacity(data.len());
    }
    let _ = uw.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tunnel message is flushed upstream as it is written, before the next comes:
    /// over TLS an unflushed message stayed in rustls when the upstream's socket was full,
    /// while the upstream (waiting for it) and the client (waiting for the answer) stalled.
    #[tokio::test]
    async fn a_tunnel_message_is_flushed_before_the_next_one_comes() {
        use super::super::test_io::{request_body, Holding};
        let mut body = request_body(&[b"hello"], false).await;
        let mut up = Holding::default();
        let counts = up.0.clone();
        let (mut received, activity) = (0, Activity::new());
        let relay = upstream(&mut body, &mut up, &mut received, &activity);
        let flushed = async {
            while counts.sent.get() < 5 {
                tokio::task::yield_now().await;
            }
        };
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::select! {
                _ = relay => panic!("the tunnel ended"),
                () = flushed => {}
            }
        });
        assert!(waited.await.is_ok(), "held back: {}", counts.held.get());
        assert_eq!(counts.held.get(), 0);
    }

    #[test]
    fn accept_matches_rfc_6455() {
        // The example of RFC 6455 section 1.3.
        assert_eq!(
            &accept_of(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let key = new_key();
        assert_eq!(key[22..], *b"==");
        assert_ne!(key, new_key());
    }

    #[test]
    fn base64_pads() {
        let mut out = [0u8; 8];
        let _ = STANDARD.encode_slice(b"ab", &mut out[..4]);
        assert_eq!(&out[..4], b"YWI=");
        let _ = STANDARD.encode_slice(b"abcd", &mut out);
        assert_eq!(&out, b"YWJjZA==");
    }
}
