//! A small blocking HTTP/1.1 client for the admin API: one request per connection
//! (`Connection: close`), response read to the end. The admin API is local and answers
//! with `Content-Length`, so this is all `weir ctl` needs, without an async runtime.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Responses larger than this are cut off (a config is far smaller).
const MAX_RESPONSE: u64 = 64 << 20;

pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `http://host:port` split into the address to connect to and the `Host` header.
pub fn authority(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        anyhow!("admin URL {url:?}: expected http://HOST:PORT (https is not supported)")
    })?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        bail!("admin URL {url:?}: no host");
    }
    Ok(host.to_string())
}

/// `text` as a URL query value: unreserved characters and `/` as they are, the rest as
/// `%XX` bytes.
pub fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(&'static str, String)>,
    pub body: &'a [u8],
}

pub fn send(authority: &str, req: &Request<'_>) -> anyhow::Result<Reply> {
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {authority}"))?
        .next()
        .ok_or_else(|| anyhow!("{authority} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).with_context(|| {
        format!(
            "cannot reach the admin API at {authority} (is weir running? are --admin, \
             $WEIR_ADMIN or -c FILE right?)"
        )
    })?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n",
        req.method,
        req.path,
        req.body.len()
    );
    for (name, value) in &req.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(req.body)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .context("reading the admin API's response")?;
    parse(&raw)
}

fn parse(raw: &[u8]) -> anyhow::Result<Reply> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("the admin API sent no complete response"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("the admin API sent a malformed status line"))?;
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    let mut body = raw[end + 4..].to_vec();
    if let Some(n) = length {
        body.truncate(n);
    }
    Ok(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_response_and_authorities() {
        let r = parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}extra").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (409, &b"{}"[..]));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"nonsense\r\n\r\n").is_err());
        assert_eq!(
            authority("http://127.0.0.1:9901/").unwrap(),
            "127.0.0.1:9901"
        );
        assert!(authority("https://x").is_err());
        assert_eq!(query_escape("a b/c&d.toml"), "a%20b/c%26d.toml");
        assert!(authority("http://").is_err());
    }
}
