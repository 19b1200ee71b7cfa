//! Weir's own answers, described once: the default response, a route's `respond` and
//! `redirect`, `redirect_https`, the admission filters' refusals, an ACME HTTP-01 key
//! authorization, and the answer to a failure. [`Answer::render`] writes the HTTP/1.1
//! response each stands for; an HTTP/1.x client gets those bytes, an HTTP/2 stream the same
//! status, fields and body as a response (or, to a gRPC request, a gRPC status:
//! `http2::local`), so every client protocol answers alike.

use crate::codec::http1::write::{push_simple_response_with, Persistence};
use crate::error::{reason_phrase, ProxyError};
use crate::filters::headers::Vars;
use crate::filters::redirect::push_redirect;
use crate::filters::respond::Canned;
use crate::request::Request;
use crate::router::RoutedPath;
use weir_config::Redirect;

/// A response Weir makes itself.
pub enum Answer<'a> {
    /// The listener's default response (no route matched): counted as one.
    Default(&'a Canned),
    /// A route's `respond`.
    Respond(&'a Canned),
    /// A route's `redirect`, or the listener's `redirect_https`.
    Redirect(&'a Redirect),
    /// A route's admission filters refused the request.
    Refused(Refusal<'a>),
    /// The key authorization of a pending ACME HTTP-01 challenge.
    Acme(String),
    /// A failure nothing was sent for yet: its status, its text as the body.
    Error(ProxyError),
}

/// Why the admission filters refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// `allow` / `deny` (403).
    Forbidden,
    /// `rate_limit` (429), with the seconds until a token is back (`Retry-After`).
    RateLimited(u64),
    /// `basic_auth` (401), with the realm of the challenge.
    Unauthorized(&'a str),
    /// A shared `rate_limit` with `on_error = "deny"` while its Redis is down (503): the
    /// fleet's count cannot be known.
    RateLimitUnavailable,
    /// `basic_auth` with `[server] password_checks` password checks already running in the
    /// process (503, `Retry-After: 1`).
    PasswordChecksBusy,
}

impl Refusal<'_> {
    pub fn status(self) -> u16 {
        match self {
            Refusal::Forbidden => 403,
            Refusal::RateLimited(_) => 429,
            Refusal::Unauthorized(_) => 401,
            Refusal::RateLimitUnavailable | Refusal::PasswordChecksBusy => 503,
        }
    }

    /// The header lines the refusal adds (each ending in CRLF).
    fn push_lines(self, out: &mut Vec<u8>) {
        match self {
            Refusal::Forbidden | Refusal::RateLimitUnavailable => {}
            Refusal::PasswordChecksBusy => out.extend_from_slice(b"Retry-After: 1\r\n"),
            Refusal::RateLimited(secs) => {
                out.extend_from_slice(b"Retry-After: ");
                crate::codec::http1::write::push_decimal(out, secs);
                out.extend_from_slice(b"\r\n");
            }
            Refusal::Unauthorized(realm) => {
                out.extend_from_slice(b"WWW-Authenticate: Basic realm=\"");
                out.extend_from_slice(realm.as_bytes());
                out.extend_from_slice(b"\", charset=\"UTF-8\"\r\n");
            }
        }
    }
}

impl Answer<'_> {
    /// The status the answer is sent with.
    pub fn status(&self) -> u16 {
        match self {
            Answer::Default(c) | Answer::Respond(c) => c.status,
            Answer::Redirect(r) => r.status,
            Answer::Refused(refusal) => refusal.status(),
            Answer::Acme(_) => 200,
            Answer::Error(error) => error.status().unwrap_or(502),
        }
    }

    /// Whether it counts as Weir's own answer (`respond`, `redirect`, a refusal), not as
    /// the default response or a failure.
    pub fn is_local(&self) -> bool {
        !matches!(self, Answer::Default(_) | Answer::Error(_))
    }

    /// What the answer's `{variable}`s expand to: a redirect's come from `r` (`path`: its
    /// routed path); no other answer has any (nothing is computed for them).
    pub fn vars<'v>(&self, r: &'v Request<'_>, path: &'v RoutedPath) -> Vars<'v> {
        match self {
            Answer::Redirect(_) => r.redirect_vars(path),
            _ => Vars::default(),
        }
    }

    /// The whole HTTP/1.1 response, without its body for a HEAD request (`is_head`): the
    /// pre-rendered bytes of a `Canned` answer, else written into `out` (emptied first).
    /// `vars`: [`Answer::vars`], for a redirect's template.
    pub fn render<'s>(
        &'s self,
        out: &'s mut Vec<u8>,
        persistence: Persistence,
        is_head: bool,
        vars: &Vars<'_>,
    ) -> &'s [u8] {
        out.clear();
        let (status, refusal) = match self {
            Answer::Default(c) | Answer::Respond(c) => return c.bytes(persistence, is_head),
            Answer::Redirect(r) => {
                push_redirect(out, r, vars, persistence);
                return out;
            }
            Answer::Refused(refusal) => (refusal.status(), Some(*refusal)),
            _ => (self.status(), None),
        };
        let text = Text::new(status, self);
        let body = text.get();
        let lines = |out: &mut Vec<u8>| refusal.map_or((), |r| r.push_lines(out));
        push_simple_response_with(out, status, lines, "text/plain", body, persistence);
        if is_head {
            out.truncate(out.len() - body.len());
        }
        out
    }
}

/// The body of an answer made of text: an ACME key authorization as it is; else the
/// error's text or the reason phrase, and a newline (on the stack: no allocation).
enum Text<'a> {
    Key(&'a [u8]),
    Line([u8; 64], usize),
}

impl<'a> Text<'a> {
    fn new(status: u16, answer: &'a Answer<'_>) -> Text<'a> {
        let text = match answer {
            Answer::Acme(key) => return Text::Key(key.as_bytes()),
            Answer::Error(error) => error.body_text(),
            _ => None,
        };
        let text = text.unwrap_or(reason_phrase(status)).as_bytes();
        let mut line = [0u8; 64];
        let len = text.len().min(63);
        line[..len].copy_from_slice(&text[..len]);
        line[len] = b'\n';
        Text::Line(line, len + 1)
    }

    fn get(&self) -> &[u8] {
        match self {
            Text::Key(key) => key,
            Text::Line(line, len) => &line[..*len],
        }
    }
}
