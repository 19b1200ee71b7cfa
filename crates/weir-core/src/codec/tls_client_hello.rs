//! The server name (SNI) and ALPN protocols of a TLS ClientHello, read from the first
//! bytes a client sends, without terminating TLS (SNI routing on TCP listeners).
//!
//! [`parse`] works on whatever has arrived so far and answers [`Parsed::Incomplete`] until
//! the ClientHello is whole. The handshake message may be split across several TLS records
//! (RFC 8446 5.1 allows any fragmentation) and the records across reads. Only the fields
//! needed to reach the extensions are checked; a malformed or non-TLS start is an error
//! and the caller decides what to do (the TCP listener falls back to its `upstream`).
//!
//! Nothing is allocated when the ClientHello fits one record (the usual case); a
//! fragmented one is reassembled into a `Vec` bounded by the caller's read cap, each
//! record joined once however many reads it takes ([`HelloReader`]).

/// Record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Largest record payload a client may send (2^14, RFC 8446 5.1).
const MAX_RECORD: usize = 1 << 14;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
/// The longest DNS name (RFC 1035: 253 characters in text form; 255 on the wire).
pub const MAX_NAME: usize = 255;
/// ALPN protocol names kept (the whole list is validated, the rest is dropped).
pub const MAX_ALPN: usize = 4;

/// What the bytes so far amount to.
// The hello is kept inline (about 1.3 KB, on the stack once per connection) rather than
// boxed: boxing would cost an allocation per connection to save stack space nobody needs.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A prefix of a ClientHello: read more.
    Incomplete,
    Hello(ClientHello),
}

/// Why the bytes are not a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The first bytes are not a TLS handshake record at all (plain text, another protocol).
    #[error("not a TLS handshake")]
    NotTls,
    /// A TLS record, but its contents do not add up.
    #[error("malformed ClientHello")]
    Malformed,
}

/// The routing facts of a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    sni: Option<Name>,
    /// The server_name extension held something that is not a host name (a port, an IPv6
    /// literal, brackets, a space...): well-formed TLS, but no name to route by.
    bad_sni: bool,
    alpn: [Option<Name>; MAX_ALPN],
}

/// A short byte string kept inline (a host name or an ALPN protocol id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Name {
    bytes: [u8; MAX_NAME],
    len: u8,
}

impl Name {
    fn new(bytes: &[u8]) -> Option<Name> {
        let len = u8::try_from(bytes.len()).ok()?;
        let mut name = Name {
            bytes: [0; MAX_NAME],
            len,
        };
        name.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(name)
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl ClientHello {
    /// The host name the client asked for (as sent: any case, no trailing dot removed).
    pub fn sni(&self) -> Option<&[u8]> {
        self.sni.as_ref().map(Name::as_bytes)
    }

    /// The client sent a server name that is not a host name (`example.com:443`, `[::1]`):
    /// [`sni`](Self::sni) is `None`, as if it had sent none.
    pub fn bad_sni(&self) -> bool {
        self.bad_sni
    }

    /// The first [`MAX_ALPN`] protocols the client offered, in its order of preference.
    pub fn alpn(&self) -> impl Iterator<Item = &[u8]> {
        self.alpn.iter().flatten().map(Name::as_bytes)
    }
}

/// Parses the ClientHello at the start of `data` (what the client sent so far), from
/// scratch: a caller that reads more and asks again uses a [`HelloReader`].
pub fn parse(data: &[u8]) -> Result<Parsed, HelloError> {
    HelloReader::default().read(data)
}

/// A ClientHello parsed as it arrives, each record looked at once: a hello split into many
/// small records (any fragmentation is legal, RFC 8446 5.1) costs time in proportion to
/// its length however it trickles in, where parsing everything again on each read was
/// quadratic in the number of records.
#[derive(Debug, Default)]
pub struct HelloReader {
    /// Bytes at the start of the data in whole records, already joined into `message`.
    scanned: usize,
    /// The payloads of those records (empty while the hello may fit its first record).
    message: Vec<u8>,
    /// Payload bytes joined so far (tests check the work is linear).
    #[cfg(test)]
    joined: usize,
}

impl HelloReader {
    /// The ClientHello at the start of `data`: everything the client sent so far, of
    /// which an earlier call saw a prefix.
    pub fn read(&mut self, data: &[u8]) -> Result<Parsed, HelloError> {
        if self.scanned == 0 {
            let Some(first) = record(data)? else {
                return Ok(Parsed::Incomplete);
            };
            // The usual case: the whole handshake message is in the first record.
            if let Some(len) = message_len(first)? {
                if first.len() >= 4 + len {
                    return client_hello(&first[4..4 + len]).map(Parsed::Hello);
                }
            }
        }
        self.reassemble(data)
    }

    /// The rare case of a ClientHello split across records: the payloads of the records
    /// not joined yet are added to the message.
    fn reassemble(&mut self, data: &[u8]) -> Result<Parsed, HelloError> {
        loop {
            let rest = data.get(self.scanned..).unwrap_or_default();
            let Some(payload) = record(rest)? else {
                return Ok(Parsed::Incomplete);
            };
            self.message.extend_from_slice(payload);
            self.scanned += 5 + payload.len();
            #[cfg(test)]
            {
                self.joined += payload.len();
            }
            if let Some(len) = message_len(&self.message)? {
                if self.message.len() >= 4 + len {
                    return client_hello(&self.message[4..4 + len]).map(Parsed::Hello);
                }
            }
        }
    }
}

/// The payload of the handshake record at the start of `data`; `None`: not all there yet.
fn record(data: &[u8]) -> Result<Option<&[u8]>, HelloError> {
    if let Some(&kind) = data.first() {
        if kind != HANDSHAKE {
            return Err(HelloError::NotTls);
        }
    }
    // Legacy record version: 3.x (SSL 3.0 to TLS 1.2's 0x0303; TLS 1.3 keeps 0x0301/0x0303).
    if let Some(&major) = data.get(1) {
        if major != 3 {
            return Err(HelloError::NotTls);
        }
    }
    let Some(header) = data.get(..5) else {
        return Ok(None);
    };
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len == 0 || len > MAX_RECORD {
        return Err(HelloError::Malformed);
    }
    Ok(data.get(5..5 + len))
}

/// The length of the ClientHello whose header starts `payload`; `None` if the 4-byte
/// header itself is not all there.
fn message_len(payload: &[u8]) -> Result<Option<usize>, HelloError> {
    if let Some(&kind) = payload.first() {
        if kind != CLIENT_HELLO {
            return Err(HelloError::Malformed);
        }
    }
    Ok(payload
        .get(1..4)
        .map(|l| usize::from(l[0]) << 16 | usize::from(l[1]) << 8 | usize::from(l[2])))
}

/// A cursor over a byte slice that fails with [`HelloError::Malformed`] past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<usize, HelloError> {
        Ok(usize::from(self.take(1)?[0]))
    }

    fn u16(&mut self) -> Result<usize, HelloError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u8()?;
        self.take(n)
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u16()?;
        self.take(n)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The ClientHello body (RFC 8446 4.1.2): version, random, session id, cipher suites,
/// compression methods, then the extensions (absent in very old clients).
fn client_hello(body: &[u8]) -> Result<ClientHello, HelloError> {
    let mut r = Reader(body);
    r.take(2 + 32)?;
    if r.vec8()?.len() > 32 {
        return Err(HelloError::Malformed);
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed);
    }
    r.vec8()?;
    let mut hello = ClientHello::default();
    if r.is_empty() {
        return Ok(hello);
    }
    let mut extensions = Reader(r.vec16()?);
    // RFC 8446 4.2: one extension of a type. A second server_name is malformed, as OpenSSL
    // and Go answer, rather than a name to route by that the server may not use.
    let (mut seen_sni, mut seen_alpn) = (false, false);
    while !extensions.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        let seen = match u16::try_from(kind) {
            Ok(EXT_SERVER_NAME) => {
                (hello.sni, hello.bad_sni) = server_name(data)?;
                &mut seen_sni
            }
            Ok(EXT_ALPN) => {
                hello.alpn = alpn(data)?;
                &mut seen_alpn
            }
            _ => continue,
        };
        if std::mem::replace(seen, true) {
            return Err(HelloError::Malformed);
        }
    }
    Ok(hello)
}

/// The `host_name` entry of a server_name extension (RFC 6066 3), and whether the entry
/// was not a host name: longer than a DNS name, with a character none has (a port's `:`,
/// an IPv6 literal, brackets), or with an empty label (`a..b`, `.a`; one trailing dot is
/// the root). Broken clients and scanners send such names; they are ignored rather than
/// failing the ClientHello, as nginx and HAProxy do. Two host_name entries are malformed
/// (RFC 6066: one name of a type; OpenSSL and Go refuse them); other types are skipped.
fn server_name(data: &[u8]) -> Result<(Option<Name>, bool), HelloError> {
    let mut r = Reader(data);
    let mut list = Reader(r.vec16()?);
    let mut found = None;
    while !list.is_empty() {
        let kind = list.u8()?;
        let name = list.vec16()?;
        if kind != 0 {
            continue;
        }
        // RFC 6066: `opaque HostName<1..2^16-1>`; an empty one is not well-formed TLS.
        if name.is_empty() || found.is_some() {
            return Err(HelloError::Malformed);
        }
        found = Some(is_host_name(name).then(|| Name::new(name)).flatten());
    }
    Ok(match found {
        Some(Some(name)) => (Some(name), false),
        Some(None) => (None, true),
        None => (None, false),
    })
}

/// Letters, digits, `-`, `_` in labels separated by single dots, none empty (a trailing
/// dot allowed): an empty label would route `x..b.example.com` by `*.b.example.com`, where
/// the HTTP listeners refuse such a Host (400).
fn is_host_name(name: &[u8]) -> bool {
    let labels = name.strip_suffix(b".").unwrap_or(name);
    labels.split(|&c| c == b'.').all(|label| {
        !label.is_empty()
            && label
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
    })
}

/// The protocol ids of an ALPN extension (RFC 7301 3.1), the first [`MAX_ALPN`] kept.
fn alpn(data: &[u8]) -> Result<[Option<Name>; MAX_ALPN], HelloError> {
    let mut r = Reader(data);
    let mut list = Reader(r.vec16()?);
    let mut out = [None; MAX_ALPN];
    let mut i = 0;
    while !list.is_empty() {
        let id = list.vec8()?;
        if id.is_empty() {
            return Err(HelloError::Malformed);
        }
        if let Some(slot) = out.get_mut(i) {
            *slot = Name::new(id);
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
