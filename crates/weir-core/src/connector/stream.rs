//! The connection to an upstream server: plain TCP or TLS over TCP, one type for the
//! exchange, the pool and the tunnel.
//!
//! An enum rather than a boxed trait object: the plain case stays a `TcpStream` inline
//! (one predictable branch per I/O call, no allocation, no virtual call), and the TLS
//! state, which is large, is boxed so the enum stays as small as a `TcpStream`.

use tokio::net::{tcp, TcpStream};
use tokio_rustls::client::TlsStream;

pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl From<TcpStream> for UpstreamStream {
    fn from(stream: TcpStream) -> Self {
        UpstreamStream::Plain(stream)
    }
}

impl UpstreamStream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            UpstreamStream::Plain(s) => s,
            UpstreamStream::Tls(s) => s.get_ref().0,
        }
    }

    /// Borrowed read and write halves, to wait on both at once. Plain TCP splits without
    /// a lock; TLS (one state for both directions) through `tokio::io::split`.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            UpstreamStream::Plain(s) => {
                let (r, w) = s.split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            UpstreamStream::Tls(s) => {
                let (r, w) = tokio::io::split(s.as_mut());
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

/// The read half of [`UpstreamStream::split`].
pub enum ReadHalf<'a> {
    Plain(tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// The write half of [`UpstreamStream::split`].
pub enum WriteHalf<'a> {
    Plain(tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
}

forward_read!(UpstreamStream, Plain, Tls);
forward_write!(UpstreamStream, Plain, Tls);
forward_read!(ReadHalf<'_>, Plain, Tls);
forward_write!(WriteHalf<'_>, Plain, Tls);
