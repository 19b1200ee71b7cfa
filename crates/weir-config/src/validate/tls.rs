//! Validation of a listener's `[listeners.tls]` table: certificate and key paths, the
//! default certificate, version floor, ALPN, client authentication and handshake limits.
//!
//! Only the shape is checked here; the files are read (and a bad one rejected with its path
//! and the reason) when weir-core builds the listener's TLS setup.

use std::path::PathBuf;

use super::{duration, int_in};
use crate::error::{FieldPath, Issue};
use crate::model::{CertKey, ClientAuth, Tls, TlsVersion};
use crate::raw::{RawCertKey, RawClientAuth, RawTls};

mod auto;
pub(super) use auto::{fill_acme_domains, fill_internal_names};

/// The protocols an HTTP listener speaks and may offer through ALPN, in the default order
/// of preference.
const ALPN_SPOKEN: &[&str] = &["h2", "http/1.1"];

/// Headers the proxy owns or that frame the message: never a client-cert header.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
];

/// `[listeners.tls]`, or `None` without one. `tcp`: the listener relays the plaintext
/// (TLS offload), so it offers no ALPN unless told and has no headers to add.
pub(super) fn tls(raw: Option<RawTls>, path: &FieldPath, tcp: bool) -> Result<Option<Tls>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    if tcp && raw.client_cert_header.is_some() {
        return Err(Issue::new(
            &path.key("client_cert_header"),
            "a tcp listener relays bytes and adds no headers",
            "remove client_cert_header (it is for protocol = \"http\" listeners)",
        ));
    }
    let acme = auto::acme(raw.acme, &path.key("acme"))?;
    let internal_ca = auto::internal_ca(raw.internal_ca, &path.key("internal_ca"))?;
    let automatic = acme.is_some() || internal_ca.is_some();
    if automatic && tcp {
        return Err(Issue::new(
            &path.key(if acme.is_some() {
                "acme"
            } else {
                "internal_ca"
            }),
            "automatic certificates are for protocol = \"http\" listeners",
            "list the certificate files in certs = [...] on a tcp listener",
        ));
    }
    if acme.is_some() && internal_ca.is_some() {
        return Err(Issue::new(
            &path.key("internal_ca"),
            "a listener takes its automatic certificates from acme or from internal_ca, not both",
            "keep acme for public names, or internal_ca for development",
        ));
    }
    let certs = match raw.certs {
        None if automatic => Vec::new(),
        raw_certs => certs(raw_certs, &path.key("certs"))?,
    };
    Ok(Some(Tls {
        acme,
        internal_ca,
        default_cert: default_cert(raw.default_cert, &certs, &path.key("default_cert"))?,
        certs,
        min_version: min_version(raw.min_version.as_deref(), &path.key("min_version"))?,
        alpn: if tcp {
            tcp_alpn(raw.alpn, &path.key("alpn"))?
        } else {
            alpn(raw.alpn, &path.key("alpn"))?
        },
        session_resumption: raw.session_resumption.unwrap_or(true),
        client_auth: client_auth(raw.client_auth, &path.key("client_auth"))?,
        client_cert_header: client_cert_header(
            raw.client_cert_header,
            &path.key("client_cert_header"),
        )?,
        handshake_timeout: duration(
            raw.handshake_timeout,
            "10s",
            &path.key("handshake_timeout"),
            true,
        )?,
        max_handshakes: int_in(
            raw.max_handshakes,
            256,
            1..=1_000_000,
            &path.key("max_handshakes"),
        )?,
    }))
}

/// A non-empty path; `what` names it in the message.
pub(super) fn file(
    raw: Option<String>,
    path: &FieldPath,
    what: &str,
    example: &str,
) -> Result<PathBuf, Issue> {
    match raw.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        Some(_) => Err(Issue::new(
            path,
            format!("the {what} path is empty"),
            format!("write the path of a PEM file, such as \"{example}\""),
        )),
        None => Err(Issue::new(
            path,
            format!("the {what} file is missing"),
            format!("add {} = \"{example}\"", path.last_key()),
        )),
    }
}

fn certs(raw: Option<Vec<RawCertKey>>, path: &FieldPath) -> Result<Vec<CertKey>, Issue> {
    let raw = raw.filter(|c| !c.is_empty()).ok_or_else(|| {
        Issue::new(
            path,
            "a TLS listener needs at least one certificate",
            r#"add certs = [{ cert = "certs/example.com.pem", key = "certs/example.com.key" }], or acme = { ... } or internal_ca = { storage = "..." } for automatic ones"#,
        )
    })?;
    let mut out: Vec<CertKey> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.into_iter().enumerate() {
        let at = path.index(i);
        let cert_key = CertKey {
            cert: file(
                entry.cert,
                &at.key("cert"),
                "certificate",
                "certs/example.com.pem",
            )?,
            key: file(entry.key, &at.key("key"), "key", "certs/example.com.key")?,
        };
        if let Some(j) = out.iter().position(|c| c.cert == cert_key.cert) {
            return Err(Issue::new(
                &at.key("cert"),
                format!(
                    "certificate \"{}\" is listed twice (also certs[{j}])",
                    cert_key.cert.display()
                ),
                "list each certificate once",
            ));
        }
        out.push(cert_key);
    }
    Ok(out)
}

fn default_cert(raw: Option<String>, certs: &[CertKey], path: &FieldPath) -> Result<usize, Issue> {
    let Some(text) = raw else { return Ok(0) };
    let wanted = PathBuf::from(text.trim());
    certs.iter().position(|c| c.cert == wanted).ok_or_else(|| {
        let listed: Vec<String> = certs
            .iter()
            .map(|c| format!("\"{}\"", c.cert.display()))
            .collect();
        Issue::new(
            path,
            format!("default_cert \"{text}\" is not one of the listed certificates"),
            format!(
                "write the cert path of one of certs ({}), or remove default_cert to use the first",
                listed.join(", ")
            ),
        )
    })
}

fn min_version(raw: Option<&str>, path: &FieldPath) -> Result<TlsVersion, Issue> {
    match raw.map(str::trim) {
        None | Some("1.2") => Ok(TlsVersion::V1_2),
        Some("1.3") => Ok(TlsVersion::V1_3),
        Some(other) => Err(Issue::new(
            path,
            format!("unsupported min_version \"{other}\""),
            r#"use min_version = "1.2" (the default) or "1.3"; older versions are insecure"#,
        )),
    }
}

/// An HTTP listener's ALPN list: only what it speaks, default all of it.
fn alpn(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(list) = raw else {
        return Ok(ALPN_SPOKEN.iter().map(|p| (*p).to_owned()).collect());
    };
    each_once(list, path, |name| {
        (!ALPN_SPOKEN.contains(&name)).then(|| {
            (
                format!("this listener does not speak \"{name}\""),
                r#"offer only what the listener speaks: alpn = ["h2", "http/1.1"] (the default), ["http/1.1"], or [] for no ALPN"#,
            )
        })
    })
}

/// A TCP listener's ALPN list: default none; any protocol names (what the upstream speaks
/// is not Weir's to know), each 1 to 255 bytes.
fn tcp_alpn(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    each_once(raw.unwrap_or_default(), path, |name| {
        (name.is_empty() || name.len() > 255).then(|| {
            (
                format!("\"{name}\" is not a valid ALPN protocol name"),
                "use a name of 1 to 255 bytes, such as \"imap\" or \"http/1.1\"",
            )
        })
    })
}

/// `list` if `refuse` finds nothing wrong with any name (else its message and fix) and no
/// name is listed twice.
fn each_once(
    list: Vec<String>,
    path: &FieldPath,
    refuse: impl Fn(&str) -> Option<(String, &'static str)>,
) -> Result<Vec<String>, Issue> {
    for (i, name) in list.iter().enumerate() {
        if let Some((message, fix)) = refuse(name) {
            return Err(Issue::new(&path.index(i), message, fix));
        }
        if list[..i].contains(name) {
            return Err(Issue::new(
                &path.index(i),
                format!("\"{name}\" is listed twice"),
                "list each protocol once",
            ));
        }
    }
    Ok(list)
}

fn client_auth(raw: Option<RawClientAuth>, path: &FieldPath) -> Result<Option<ClientAuth>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    Ok(Some(ClientAuth {
        ca: file(raw.ca, &path.key("ca"), "client CA", "certs/clients-ca.pem")?,
        required: raw.required.unwrap_or(true),
    }))
}

fn client_cert_header(raw: Option<String>, path: &FieldPath) -> Result<Option<String>, Issue> {
    let Some(name) = raw else { return Ok(None) };
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(Issue::new(
            path,
            format!("\"{name}\" is not a valid header name"),
            r#"use letters, digits and '-', such as "X-Forwarded-Client-Cert""#,
        ));
    }
    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(Issue::new(
            path,
            format!("\"{name}\" is a header the proxy sets or needs for framing"),
            r#"use a header of its own, such as "X-Forwarded-Client-Cert""#,
        ));
    }
    Ok(Some(name))
}
