//! The PROXY protocol (HAProxy's spec, versions 1 and 2): a header in front of a TCP stream
//! that carries the original client and destination addresses through a proxy.
//!
//! - `parse`: incremental, allocation-free parsing of a v1 or v2 header at the start of a
//!   buffer (returns `Incomplete` until the whole header is there)
//! - `encode`: the v1 or v2 header Weir sends to upstream servers, on the stack

mod encode;
mod parse;

pub use encode::{encode, Header};
pub use parse::{parse, Parsed, ProxyHeaderError};

use std::net::SocketAddr;

/// The addresses a PROXY header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// The original client.
    pub source: SocketAddr,
    /// The address the client connected to.
    pub destination: SocketAddr,
}

/// The v2 signature: `\r\n\r\n\0\r\nQUIT\n`.
pub const V2_SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// The longest v1 header, CRLF included (spec section 2.1).
pub const V1_MAX: usize = 107;
