//! Validation of `[tracing]` (the collector, sampling, the export queue) and of a route's
//! `tracing = { sampling }`.

use super::{duration, int_in};
use crate::error::{FieldPath, Issue};
use crate::model::{Tracing, TracingEndpoint};
use crate::raw::{RawRouteTracing, RawTracing};

/// Default `queue_size` (the OpenTelemetry SDK's default for its batch processor).
const DEFAULT_QUEUE_SIZE: i64 = 2048;
/// Default `batch_size` (the SDK's `max_export_batch_size`).
const DEFAULT_BATCH_SIZE: i64 = 512;

pub(super) fn tracing(raw: RawTracing, path: &FieldPath) -> Result<Tracing, Issue> {
    let endpoint = endpoint(raw.endpoint, &path.key("endpoint"))?;
    let sampling = sampling(raw.sampling, 0.01, &path.key("sampling"))?;
    let service_name = raw.service_name.unwrap_or_else(|| "weir".to_owned());
    if service_name.trim().is_empty() {
        return Err(Issue::new(
            &path.key("service_name"),
            "service_name is empty",
            "name the service spans are reported for, or leave it out (default \"weir\")",
        ));
    }
    let headers = headers(raw.headers.unwrap_or_default(), &path.key("headers"))?;
    let queue_size = int_in(
        raw.queue_size,
        DEFAULT_QUEUE_SIZE,
        1..=1_000_000,
        &path.key("queue_size"),
    )?;
    let batch_size: usize = int_in(
        raw.batch_size,
        DEFAULT_BATCH_SIZE,
        1..=65_536,
        &path.key("batch_size"),
    )?;
    if batch_size > queue_size {
        return Err(Issue::new(
            &path.key("batch_size"),
            format!("batch_size ({batch_size}) is larger than queue_size ({queue_size})"),
            "set batch_size at most queue_size",
        ));
    }
    let ca = match raw.ca_file {
        Some(_) if !endpoint.tls => {
            return Err(Issue::new(
                &path.key("ca_file"),
                "ca_file is set but the endpoint is http://",
                "use an https:// endpoint, or remove ca_file",
            ))
        }
        Some(file) => Some(super::upstream_tls::certificates(
            file,
            &path.key("ca_file"),
        )?),
        None => None,
    };
    Ok(Tracing {
        endpoint,
        sampling,
        service_name,
        headers,
        queue_size,
        batch_size,
        batch_delay: duration(raw.batch_delay, "5s", &path.key("batch_delay"), true)?,
        timeout: duration(raw.timeout, "10s", &path.key("timeout"), true)?,
        ca,
    })
}

/// A route's `tracing = { sampling }`.
pub(super) fn route_tracing(
    raw: Option<RawRouteTracing>,
    path: &FieldPath,
) -> Result<Option<f64>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    let at = path.key("tracing").key("sampling");
    if raw.sampling.is_none() {
        return Err(Issue::new(
            &at,
            "tracing has no sampling",
            "set tracing = { sampling = 1.0 } (a share from 0.0 to 1.0), or remove tracing",
        ));
    }
    sampling(raw.sampling, 0.0, &at).map(Some)
}

/// A share from 0.0 to 1.0.
fn sampling(raw: Option<f64>, default: f64, path: &FieldPath) -> Result<f64, Issue> {
    let value = raw.unwrap_or(default);
    if !(0.0..=1.0).contains(&value) {
        return Err(Issue::new(
            path,
            format!("sampling = {value} is not a share from 0.0 to 1.0"),
            "set sampling between 0.0 (no new traces) and 1.0 (every request), such as 0.01",
        ));
    }
    Ok(value)
}

/// `http://` or `https://host:port/path` (the port defaults to 4318, OTLP/HTTP's, the
/// path to `/v1/traces`).
fn endpoint(raw: Option<String>, path: &FieldPath) -> Result<TracingEndpoint, Issue> {
    let fix = "write endpoint as an OTLP/HTTP URL such as \"http://collector:4318/v1/traces\" or \"https://collector/v1/traces\"";
    let Some(text) = raw else {
        return Err(Issue::new(path, "[tracing] has no endpoint", fix));
    };
    let trimmed = text.trim();
    let (tls, rest) = match (
        trimmed.strip_prefix("http://"),
        trimmed.strip_prefix("https://"),
    ) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => {
            let why = format!("endpoint \"{text}\" is not an http:// or https:// URL");
            return Err(Issue::new(path, why, fix));
        }
    };
    let (authority, url_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/v1/traces"),
    };
    let valid = !authority.is_empty()
        && !authority.contains(['@', ' ', '?', '#'])
        && !url_path.contains([' ', '#', '\r', '\n']);
    if !valid {
        return Err(Issue::new(
            path,
            format!("endpoint \"{text}\" is not a valid URL"),
            fix,
        ));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.ends_with(':') && port.parse::<u16>().is_ok());
    let authority = match has_port {
        true => authority.to_owned(),
        false if authority.ends_with(']') || !authority.contains(':') => {
            format!("{authority}:4318")
        }
        false => {
            return Err(Issue::new(
                path,
                format!("endpoint \"{text}\" has a bad port"),
                fix,
            ));
        }
    };
    Ok(TracingEndpoint {
        authority,
        path: url_path.to_owned(),
        tls,
    })
}

/// Header names are tokens and values visible ASCII, so each is one valid request line.
fn headers(
    raw: std::collections::BTreeMap<String, String>,
    path: &FieldPath,
) -> Result<Vec<(String, String)>, Issue> {
    let mut out = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let at = path.key(&name);
        let token = !name.is_empty() && name.bytes().all(super::is_tchar);
        let reserved = [
            "host",
            "content-length",
            "content-type",
            "connection",
            "transfer-encoding",
        ]
        .iter()
        .any(|r| name.eq_ignore_ascii_case(r));
        if !token || reserved {
            return Err(Issue::new(
                &at,
                format!("\"{name}\" cannot be a header for the collector"),
                "name a header such as \"Authorization\" or \"X-Api-Key\" (Host, Content-Length, Content-Type and Connection are Weir's)",
            ));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(Issue::new(
                &at,
                format!("the value of header \"{name}\" has a control or non-ASCII character"),
                "use visible ASCII characters and spaces only",
            ));
        }
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TracingEndpoint, Issue> {
        endpoint(Some(text.to_owned()), &FieldPath::default().key("endpoint"))
    }

    #[test]
    fn endpoints_get_a_port_and_path() {
        let e = parse("http://collector:4318/v1/traces").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.path.as_str()),
            ("collector:4318", "/v1/traces")
        );
        let e = parse("http://collector").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.path.as_str()),
            ("collector:4318", "/v1/traces")
        );
        let e = parse("http://[::1]/x").unwrap();
        assert_eq!(e.authority, "[::1]:4318");
        assert!(!e.tls);
        let e = parse("https://collector.example/v1/traces").unwrap();
        assert_eq!(e.authority, "collector.example:4318");
        assert!(e.tls);
        assert!(parse("ftp://collector/").is_err());
        assert!(parse("collector:4318").is_err());
        assert!(parse("http://a:99999/").is_err());
        assert!(parse("http:///x").is_err());
    }
}
