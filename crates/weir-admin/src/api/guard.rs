//! Which browsers' requests the admin listener serves: defences against DNS rebinding and
//! cross-site requests, applied with or without a token (defence in depth), after Caddy's
//! admin `origins` and `enforce_origin`.
//!
//! A page on `http://rebind.evil.com:9901/` whose name the attacker then points at
//! 127.0.0.1 is same-origin with the API in the browser's eyes: it can read and write it,
//! and the token check alone does not help when no token is set. What it cannot change is
//! the `Host` it sends, its own name. So every request except the probes (`/live`,
//! `/ready`: a fixed word, no data, no effect, and load balancers' probes may send any
//! Host or none) must name the listener itself ([`check`]): an IP literal equal to its
//! address (any loopback literal or `localhost` for a loopback bind; any IP literal or
//! `localhost` for a wildcard bind, since rebinding needs a name), or an entry of
//! `[admin] allowed_hosts`. The port of `Host` is not compared: a rebinding page must use
//! the listener's port already, and port forwarding (containers) changes it. An `Origin`'s
//! is: it must be the origin `Host` names, port included (a page of another service on
//! `http://localhost:8080` is not the API's), or a name of `allowed_hosts`.
//!
//! A page on another site can still send "simple" requests the browser does not preflight:
//! GET, and POST with a form's content types. An `Origin` is checked as above; a write
//! marked `Sec-Fetch-Site: cross-site` or `same-site` is refused (Go's
//! `CrossOriginProtection` does the same); and a write must declare a JSON or TOML body
//! ([`content_type`]), which no form can send, so a cross-site `text/plain` POST to
//! `/caches/purge` is a 415.

use std::net::{IpAddr, SocketAddr};

use hyper::header::{CONTENT_TYPE, HOST, ORIGIN};
use hyper::{HeaderMap, Method, StatusCode, Uri};

use super::error::ApiError;

/// Whether a request may be served: its `Host` (and the authority of an absolute-form
/// target) names the admin listener at `listener` or an `allowed` entry, its `Origin`
/// does too, and a write does not come from another site.
pub fn check(
    listener: SocketAddr,
    allowed: &[String],
    headers: &HeaderMap,
    uri: &Uri,
    method: &Method,
) -> Result<(), ApiError> {
    let names = Names { listener, allowed };
    let host = match one(headers, HOST) {
        Some(host) if names.admit(host) => host,
        Some(host) => return Err(names.refused("Host", host)),
        None => return Err(names.refused("Host", "")),
    };
    if let Some(authority) = uri.authority().map(|a| a.as_str()) {
        if !names.admit(authority) {
            return Err(names.refused("the request target", authority));
        }
    }
    if headers.contains_key(ORIGIN) {
        let origin = one(headers, ORIGIN).unwrap_or("(several)");
        if !origin_host(origin).is_some_and(|(a, port)| names.admit_origin(a, host, port)) {
            return Err(names.refused("Origin", origin));
        }
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    match site {
        Some(site) if is_write(method) && !matches!(site, "same-origin" | "none") => {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("a write from another site (Sec-Fetch-Site: {site})"),
                "change the config from weir ctl, curl or the dashboard served by this listener",
            )
            .field("Sec-Fetch-Site"))
        }
        _ => Ok(()),
    }
}

/// The value of a header sent once (`\u{fffd}` when not text); `None` when absent or
/// repeated (a browser sends each of `Host` and `Origin` once).
fn one(headers: &HeaderMap, name: hyper::header::HeaderName) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => Some(v.to_str().unwrap_or("\u{fffd}")),
        _ => None,
    }
}

/// POST, PUT, PATCH and DELETE: the methods the API changes something with.
pub fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// Whether a write declares a body type the API reads: `application/json` or
/// `application/toml` (parameters such as `charset` allowed). A body-less PUT, PATCH or
/// DELETE may go without one (`weir ctl server remove`, `delete`): browsers preflight those
/// methods across sites, and the API answers no preflight. A POST always needs one, since
/// a cross-site POST without a body and without a type is a simple request.
pub fn content_type(
    method: &Method,
    headers: &HeaderMap,
    empty_body: bool,
) -> Result<(), ApiError> {
    if !is_write(method) {
        return Ok(());
    }
    let given = headers.get(CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?"));
    let media = given.map(|t| {
        t.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match media.as_deref() {
        Some("application/json" | "application/toml") => Ok(()),
        None if empty_body && method != Method::POST => Ok(()),
        _ => Err(unsupported(given.unwrap_or("(none)"))),
    }
}

/// A 415 for a write whose `Content-Type` the endpoint does not read.
pub fn unsupported(given: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("a write needs Content-Type: application/json (or application/toml where the endpoint takes TOML), not {given}"),
        "send Content-Type: application/json (curl: -H 'Content-Type: application/json'; \
         -d alone sends a form type, which a cross-site page could send too)",
    )
    .field("Content-Type")
}

/// The `host[:port]` of an `http` or `https` Origin and its scheme's default port (`None`:
/// `null`, another scheme, or a path after it).
fn origin_host(origin: &str) -> Option<(&str, &'static str)> {
    let (rest, port) = match origin.strip_prefix("http://") {
        Some(rest) => (rest, ":80"),
        None => (origin.strip_prefix("https://")?, ":443"),
    };
    (!rest.contains('/')).then_some((rest, port))
}

/// Whether two authorities are the same once lower-cased and stripped of the scheme's
/// `default_port`.
fn same_authority(a: &str, b: &str, default_port: &str) -> bool {
    let bare = |s: &str| {
        let s = s.to_ascii_lowercase();
        match s.strip_suffix(default_port) {
            Some(rest) => rest.to_owned(),
            None => s,
        }
    };
    bare(a) == bare(b)
}

/// The names a request may give for the admin listener.
struct Names<'a> {
    listener: SocketAddr,
    allowed: &'a [String],
}

impl Names<'_> {
    /// Whether `authority` (`host`, `host:port`, `[v6]:port`) names the listener.
    fn admit(&self, authority: &str) -> bool {
        let Some(host) = host_part(authority) else {
            return false;
        };
        let own = self.listener.ip().to_canonical();
        let own_name = match host.parse::<IpAddr>() {
            Ok(ip) => {
                let ip = ip.to_canonical();
                ip == own || own.is_unspecified() || (own.is_loopback() && ip.is_loopback())
            }
            Err(_) => host == "localhost" && (own.is_loopback() || own.is_unspecified()),
        };
        own_name || self.allows(&host)
    }

    /// Whether an `Origin`'s `authority` may call the API: the page's origin is the one
    /// its `Host` names (`host`, already admitted), port included, or a name of
    /// `allowed_hosts` (a front proxy may rewrite `Host`; the port is not compared). A page
    /// of another local service (`http://localhost:8080`) is not the API's, even though
    /// `localhost` names the listener.
    fn admit_origin(&self, authority: &str, host: &str, default_port: &str) -> bool {
        same_authority(authority, host, default_port)
            || host_part(authority).is_some_and(|h| self.allows(&h))
    }

    /// Whether `host` (lower-cased, as [`host_part`] gives it) is an `allowed_hosts`
    /// entry; an IP address is compared as the config stores it (`IpAddr`'s text), so
    /// `2001:DB8:0::1` matches `2001:db8::1`.
    fn allows(&self, host: &str) -> bool {
        match host.parse::<IpAddr>() {
            Ok(ip) => self.allowed.contains(&ip.to_string()),
            Err(_) => self.allowed.iter().any(|a| a == host),
        }
    }

    fn refused(&self, what: &str, given: &str) -> ApiError {
        if what == "Origin" {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!("Origin {given:?} is not the origin the Host names, nor an allowed name (a cross-site request?)"),
                "use the dashboard served by this listener; a proxy in front must pass the \
                 browser's Host (nginx: proxy_set_header Host $http_host), or list the name \
                 the browser uses in [admin] allowed_hosts (not localhost: that would admit \
                 every local port's pages)",
            )
            .field("Origin");
        }
        let message = match given {
            "" => format!("the request has no {what} header, or more than one"),
            _ => format!("{what} {given:?} does not name this admin listener (DNS rebinding or a cross-site request?)"),
        };
        let fix = format!(
            "reach the admin API as http://{}/ (weir ctl --admin); to reach it by another \
             name, add that name to [admin] allowed_hosts",
            self.own_authority()
        );
        ApiError::new(StatusCode::FORBIDDEN, message, fix).field("Host")
    }

    /// The address to suggest: the listener's, on loopback when it binds a wildcard.
    fn own_authority(&self) -> SocketAddr {
        let mut addr = self.listener;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr
    }
}

/// The host of an authority, lower-cased, an IPv6 literal without its brackets; `None`
/// when it is malformed (a bare IPv6 address, a port that is not a number, no host).
fn host_part(authority: &str) -> Option<String> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (inner, after) = rest.split_once(']')?;
            inner.parse::<std::net::Ipv6Addr>().ok()?;
            (inner, after.strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let after_bracket = authority.starts_with('[') && port.is_none() && !authority.ends_with(']');
    (port_ok && !host.is_empty() && !after_bracket).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names<'a>(listener: &str, allowed: &'a [String]) -> Names<'a> {
        Names {
            listener: listener.parse().unwrap(),
            allowed,
        }
    }

    /// Asserts that `n` admits every authority of `ok` and none of `bad`.
    #[track_caller]
    fn sorts(n: &Names<'_>, ok: &[&str], bad: &[&str]) {
        for a in ok {
            assert!(n.admit(a), "{a} admitted");
        }
        for a in bad {
            assert!(!n.admit(a), "{a} refused");
        }
    }

    #[test]
    fn a_loopback_listener_answers_to_loopback_literals_and_localhost() {
        let ok = [
            "127.0.0.1",
            "127.0.0.1:9901",
            "127.0.0.1:1",
            "[::1]:9901",
            "LOCALHOST:9901",
            "localhost",
        ];
        let malformed = [
            ":9901",
            "127.0.0.1:",
            "127.0.0.1:x",
            "::1",
            "[::1",
            "[::1]x",
            "",
        ];
        let foreign = [
            "rebind.evil.com",
            "rebind.evil.com:9901",
            "10.0.0.1:9901",
            "localhost.:9901",
            "127.1",
        ];
        let n = names("127.0.0.1:9901", &[]);
        sorts(&n, &ok, &malformed);
        sorts(&n, &[], &foreign);
    }

    #[test]
    fn other_binds_answer_to_their_address_and_allowed_names() {
        let allowed = ["weir-admin.internal".to_string(), "203.0.113.7".to_string()];
        let ok = [
            "10.0.0.5:9901",
            "weir-admin.internal:9901",
            "Weir-Admin.Internal",
            "203.0.113.7:19901",
        ];
        let bad = [
            "10.0.0.6:9901",
            "127.0.0.1:9901",
            "localhost:9901",
            "evil.internal",
        ];
        sorts(&names("10.0.0.5:9901", &allowed), &ok, &bad);
        let v6 = ["2001:db8::1".to_string()];
        sorts(&names("10.0.0.5:9901", &v6), &["[2001:DB8:0::1]:9901"], &[]);
        // An Origin names the Host's origin, port included, or an allowed name.
        let n = names("10.0.0.5:9901", &allowed);
        assert!(n.admit_origin("weir-admin.internal:443", "10.0.0.5:9901", ":443"));
        assert!(!n.admit_origin("10.0.0.5:8080", "10.0.0.5:9901", ":80"));
        // A wildcard bind: any IP literal (a rebinding page sends a name), and localhost.
        let ok = ["192.0.2.1:9901", "[2001:db8::1]:9901", "localhost:9901"];
        sorts(&names("[::]:9901", &[]), &ok, &["rebind.evil.com:9901"]);
    }

    #[test]
    fn origins_are_checked_like_hosts_and_cross_site_writes_refused() {
        let (uri, listener): (Uri, SocketAddr) = (
            "/api/v1/config".parse().unwrap(),
            "127.0.0.1:9901".parse().unwrap(),
        );
        let run = |pairs: &[(&'static str, &str)], method: Method| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            check(listener, &[], &h, &uri, &method).map_err(|e| (e.status, e.field))
        };
        let host = ("host", "127.0.0.1:9901");
        assert!(run(&[host], Method::GET).is_ok());
        assert!(run(&[host, ("origin", "http://127.0.0.1:9901")], Method::POST).is_ok());
        assert!(run(
            &[
                ("host", "LOCALHOST:9901"),
                ("origin", "http://localhost:9901"),
                ("sec-fetch-site", "same-origin")
            ],
            Method::PUT
        )
        .is_ok());
        let default_port = [("host", "127.0.0.1"), ("origin", "http://127.0.0.1:80")];
        assert!(run(&default_port, Method::POST).is_ok());
        for origin in [
            "http://evil.com",
            "http://localhost:9901",
            "http://127.0.0.1:8080",
            "null",
            "http://127.0.0.1:9901/x",
            "file://",
            "chrome-extension://abc",
        ] {
            let refused = run(&[host, ("origin", origin)], Method::GET);
            assert_eq!(
                refused,
                Err((StatusCode::FORBIDDEN, "Origin".into())),
                "{origin}"
            );
        }
        let cross = run(&[host, ("sec-fetch-site", "same-site")], Method::POST);
        assert_eq!(cross, Err((StatusCode::FORBIDDEN, "Sec-Fetch-Site".into())));
        assert!(
            run(&[host, ("sec-fetch-site", "cross-site")], Method::GET).is_ok(),
            "a read"
        );
        assert_eq!(
            run(&[], Method::GET).unwrap_err().0,
            StatusCode::FORBIDDEN,
            "no Host"
        );
        let absolute: Uri = "http://evil.com/api/v1/config".parse().unwrap();
        let h = HeaderMap::from_iter([(HOST, "127.0.0.1:9901".parse().unwrap())]);
        assert!(check(listener, &[], &h, &absolute, &Method::GET).is_err());
    }

    #[test]
    fn writes_declare_json_or_toml() {
        let with = |t: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(t) = t {
                h.insert(CONTENT_TYPE, t.parse().unwrap());
            }
            h
        };
        let status = |m: Method, t: Option<&str>, empty: bool| {
            content_type(&m, &with(t), empty).map_err(|e| e.status)
        };
        assert!(status(Method::PUT, Some("application/json"), false).is_ok());
        assert!(status(Method::PUT, Some("Application/TOML; charset=utf-8"), false).is_ok());
        assert!(
            status(Method::DELETE, None, true).is_ok(),
            "weir ctl delete"
        );
        assert!(
            status(Method::GET, Some("text/plain"), false).is_ok(),
            "reads are not checked"
        );
        let refused = Err(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(status(Method::POST, Some("text/plain"), false), refused);
        assert_eq!(
            status(Method::POST, None, true),
            refused,
            "a body-less simple POST"
        );
        assert_eq!(status(Method::PUT, None, false), refused);
        assert_eq!(
            status(
                Method::POST,
                Some("application/x-www-form-urlencoded"),
                false
            ),
            refused
        );
        assert_eq!(
            status(
                Method::PATCH,
                Some("multipart/form-data; boundary=x"),
                false
            ),
            refused
        );
    }
}
