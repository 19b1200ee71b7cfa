//! The sending half of a request stream ([`SendHalf`]): every write waits at most its
//! `stall` for the client's flow-control credit, and a write cut short leaves the stream
//! reset and written no more.
//!
//! Why: h3-quinn keeps a frame it has begun to write pending in the stream, and a write
//! that comes while one is pending fails the whole QUIC connection (H3_INTERNAL_ERROR),
//! every sibling stream with it. A write is cut short by its stall timeout, by a failure
//! of the stream, or by its future being dropped (a 1xx head whose wait for the final
//! head ended: a response timeout, the client gone). So the stream is marked while a
//! write is under way; a write that did not end well leaves the mark, and the stream is
//! reset (now, at the next write, or when the half is dropped) instead of written.

use std::io::ErrorKind;
use std::time::Duration;

use bytes::Bytes;
use h3::error::{Code, StreamError};
use h3::server::RequestStream;

use crate::error::ProxyError;
use crate::time::with_timeout;

/// What a failed read or write on a client's stream means for the exchange. Only a
/// stream the client terminated (RESET_STREAM, STOP_SENDING) or a connection that closed
/// is `ClientClosed`, which a stream spends the connection's reset budget on (`conn`; not
/// when the connection closed): a send h3 refused on its own (a head over the client's
/// `SETTINGS_MAX_FIELD_SECTION_SIZE`, a broken stream) is no reset by the client.
pub(crate) fn client_error(e: StreamError) -> ProxyError {
    match e {
        StreamError::RemoteTerminate { .. } | StreamError::ConnectionError { .. } => {
            ProxyError::ClientClosed
        }
        _ => UNUSABLE,
    }
}

/// A stream Weir cannot write on any more (its own send failed or was cut short).
const UNUSABLE: ProxyError = ProxyError::ClientIo(ErrorKind::Other);

/// The sending half of a request stream.
pub(crate) struct SendHalf {
    stream: RequestStream<h3_quinn::SendStream<Bytes>, Bytes>,
    /// A write is under way, or one was cut short (then the stream is reset and written
    /// no more).
    writing: bool,
}

/// What an HTTP/3 stream's exchange answers into: the stream's sending half, and the QUIC
/// connection it is on, whose close cancels the exchange at once.
pub(crate) struct H3Responder<'s> {
    pub send: &'s mut SendHalf,
    pub quic: &'s quinn::Connection,
}

/// Why a response head was not sent.
enum Unsent {
    /// Over the client's `SETTINGS_MAX_FIELD_SECTION_SIZE`: h3 refused it before writing
    /// any of it, so the stream goes on.
    TooBig,
    Failed(ProxyError),
}

impl SendHalf {
    pub fn new(stream: RequestStream<h3_quinn::SendStream<Bytes>, Bytes>) -> SendHalf {
        SendHalf {
            stream,
            writing: false,
        }
    }

    /// Sends the final response head.
    pub async fn send_head(
        &mut self,
        head: http::Response<()>,
        stall: Duration,
    ) -> Result<(), ProxyError> {
        self.head(head, stall).await.map_err(|unsent| match unsent {
            Unsent::TooBig => UNUSABLE,
            Unsent::Failed(e) => e,
        })
    }

    /// Sends a 1xx head; `Ok(false)`: skipped, larger than the client takes.
    pub async fn send_informational(
        &mut self,
        head: http::Response<()>,
        stall: Duration,
    ) -> Result<bool, ProxyError> {
        match self.head(head, stall).await {
            Ok(()) => Ok(true),
            Err(Unsent::TooBig) => Ok(false),
            Err(Unsent::Failed(e)) => Err(e),
        }
    }

    async fn head(&mut self, head: http::Response<()>, stall: Duration) -> Result<(), Unsent> {
        self.begin().map_err(Unsent::Failed)?;
        let sent = with_timeout(stall, self.stream.send_response(head)).await;
        if let Ok(Err(StreamError::HeaderTooBig { .. })) = sent {
            self.writing = false;
            return Err(Unsent::TooBig);
        }
        self.end(sent).map_err(Unsent::Failed)
    }

    /// Sends `data` as DATA.
    pub async fn send_data(&mut self, data: Bytes, stall: Duration) -> Result<(), ProxyError> {
        self.begin()?;
        let sent = with_timeout(stall, self.stream.send_data(data)).await;
        self.end(sent)
    }

    /// Sends the trailers.
    pub async fn send_trailers(
        &mut self,
        fields: http::HeaderMap,
        stall: Duration,
    ) -> Result<(), ProxyError> {
        self.begin()?;
        let sent = with_timeout(stall, self.stream.send_trailers(fields)).await;
        self.end(sent)
    }

    /// Ends the stream (what is pending written first).
    pub async fn finish(&mut self, stall: Duration) -> Result<(), ProxyError> {
        self.begin()?;
        let sent = with_timeout(stall, self.stream.finish()).await;
        self.end(sent)
    }

    /// Resets the stream with `code`: nothing more is written on it.
    pub fn stop_stream(&mut self, code: Code) {
        self.writing = true;
        self.stream.stop_stream(code);
    }

    /// Marks a write under way; `Err` when one was cut short (the stream is reset).
    fn begin(&mut self) -> Result<(), ProxyError> {
        if self.writing {
            self.stream.stop_stream(Code::H3_INTERNAL_ERROR);
            return Err(UNUSABLE);
        }
        self.writing = true;
        Ok(())
    }

    /// A write's outcome, within its stall (`E`: it timed out); a failed one resets the
    /// stream.
    fn end<E>(&mut self, sent: Result<Result<(), StreamError>, E>) -> Result<(), ProxyError> {
        let sent = sent
            .map_err(|_| ProxyError::ClientTimeout)
            .and_then(|sent| sent.map_err(client_error));
        match sent {
            Ok(()) => self.writing = false,
            Err(_) => self.stream.stop_stream(Code::H3_INTERNAL_ERROR),
        }
        sent
    }
}

impl Drop for SendHalf {
    fn drop(&mut self) {
        // A write cut short (its future dropped): h3-quinn would end the stream with the
        // partial frame in it.
        if self.writing {
            self.stream.stop_stream(Code::H3_INTERNAL_ERROR);
        }
    }
}
