//! Validation of an upstream's `protocol` ("http1", "h2", "h2c", "auto"): the HTTP
//! version HTTP/2 clients' requests use to reach its servers.

use crate::error::{FieldPath, Issue};
use crate::model::UpstreamProtocol;
use crate::raw::RawUpstream;

/// The accepted values, for messages.
const PROTOCOLS: &str = r#""http1", "h2", "h2c" or "auto""#;

pub(super) fn protocol(raw: &RawUpstream, path: &FieldPath) -> Result<UpstreamProtocol, Issue> {
    let key = path.key("protocol");
    let protocol = match raw.protocol.as_deref().map(str::trim) {
        None | Some("http1") => UpstreamProtocol::Http1,
        Some("h2") => UpstreamProtocol::H2,
        Some("h2c") => UpstreamProtocol::H2c,
        Some("auto") => UpstreamProtocol::Auto,
        Some(other) => {
            let hint = match other {
                "http2" | "HTTP/2" | "http/2" => r#" (did you mean "h2", or "h2c" without TLS?)"#,
                "http/1.1" | "HTTP/1.1" | "http1.1" => r#" (did you mean "http1"?)"#,
                _ => "",
            };
            return Err(Issue::new(
                &key,
                format!("unknown protocol \"{other}\"{hint}"),
                format!("use one of {PROTOCOLS}"),
            ));
        }
    };
    if protocol == UpstreamProtocol::H2 && raw.tls.is_none() {
        return Err(Issue::new(
            &key,
            "protocol \"h2\" is HTTP/2 over TLS, but the upstream has no tls",
            r#"add tls = { ... } to the upstream, or use protocol = "h2c" for cleartext HTTP/2"#,
        ));
    }
    if protocol == UpstreamProtocol::H2c && raw.tls.is_some() {
        return Err(Issue::new(
            &key,
            "protocol \"h2c\" is cleartext HTTP/2, but the upstream has tls",
            r#"use protocol = "h2" for HTTP/2 over TLS, or remove tls"#,
        ));
    }
    Ok(protocol)
}
