//! Validation of a pool's `discover = { dns, kind, interval, respect_ttl, nameserver,
//! timeout }`: DNS service discovery, done by the data plane while it runs (no lookup
//! here, so `weir check` works offline).

use std::net::SocketAddr;

use super::{check_host_port, duration};
use crate::error::{FieldPath, Issue};
use crate::model::{Discover, DiscoverKind};
use crate::raw::RawDiscover;

/// `upstreams.NAME.discover`; `has_servers`: the pool also lists `servers`.
pub(super) fn discover(
    raw: Option<RawDiscover>,
    has_servers: bool,
    upstream: &FieldPath,
) -> Result<Option<Discover>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    let path = upstream.key("discover");
    if has_servers {
        return Err(Issue::new(
            &upstream.key("servers"),
            "a pool with discover takes its servers from DNS, so it cannot list servers too",
            "remove servers, or remove discover and list the servers",
        ));
    }
    let dns_path = path.key("dns");
    let dns = raw.dns.map(|d| d.trim().to_owned()).ok_or_else(|| {
        Issue::new(
            &dns_path,
            "discover has no dns name",
            r#"write dns = "backend.internal:8080" (or an SRV name with kind = "SRV")"#,
        )
    })?;
    let (name, kind) = match raw.kind.as_deref().map(str::trim) {
        None | Some("A/AAAA") => {
            check_host_port(&dns, &dns_path)?;
            let (host, port) = dns.rsplit_once(':').unwrap_or((&dns, ""));
            let port = port.parse().unwrap_or(0);
            (host_name(host, &dns_path)?, DiscoverKind::Ip { port })
        }
        Some("SRV") => (srv_name(&dns, &dns_path)?, DiscoverKind::Srv),
        Some(other) => {
            return Err(Issue::new(
                &path.key("kind"),
                format!("unknown discover kind \"{other}\""),
                r#"use kind = "A/AAAA" (the default: every address on the port of dns) or "SRV" (ports and weights from SRV records)"#,
            ))
        }
    };
    Ok(Some(Discover {
        name,
        kind,
        interval: duration(raw.interval, "30s", &path.key("interval"), true)?,
        respect_ttl: raw.respect_ttl.unwrap_or(false),
        nameserver: raw
            .nameserver
            .map(|n| nameserver(&n, &path.key("nameserver")))
            .transpose()?,
        timeout: duration(raw.timeout, "2s", &path.key("timeout"), true)?,
    }))
}

/// A DNS name: labels of letters, digits, '-' and '_' (not an IP address: that needs no
/// discovery).
fn host_name(host: &str, path: &FieldPath) -> Result<String, Issue> {
    if host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok()
    {
        return Err(Issue::new(
            path,
            format!("\"{host}\" is an IP address, which DNS does not change"),
            "list it in servers = [{ addr = \"...\" }] instead, or give a host name",
        ));
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let valid = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid) {
        return Err(Issue::new(
            path,
            format!("\"{host}\" is not a valid DNS name"),
            "use labels of letters, digits, '-' and '_' separated by single dots",
        ));
    }
    Ok(name.to_owned())
}

/// An SRV name (`_service._proto.name`), written without a port.
fn srv_name(dns: &str, path: &FieldPath) -> Result<String, Issue> {
    if dns
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        return Err(Issue::new(
            path,
            format!("SRV name \"{dns}\" has a port; SRV records give the ports"),
            "write the SRV name alone, such as \"_http._tcp.backend.internal\"",
        ));
    }
    host_name(dns, path)
}

fn nameserver(text: &str, path: &FieldPath) -> Result<SocketAddr, Issue> {
    let text = text.trim();
    text.parse::<SocketAddr>()
        .or_else(|_| {
            text.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, 53))
        })
        .map_err(|_| {
            Issue::new(
                path,
                format!("nameserver \"{text}\" is not an IP address (with an optional port)"),
                "write nameserver = \"10.0.0.2\" or \"127.0.0.1:5353\", or leave it out to \
                 use the system's (/etc/resolv.conf)",
            )
        })
}

#[cfg(test)]
mod tests {
    use crate::model::DiscoverKind;
    use crate::validate::tests::check;
    use std::time::Duration;

    /// A listener (lines 1-3) and upstream `u` (header on line 4) with `lines`.
    fn pool(lines: &str) -> String {
        format!("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n[upstreams.u]\n{lines}")
    }

    #[test]
    fn discover_settings() {
        let text = pool("discover = { dns = \"api.internal:8080\", respect_ttl = true, nameserver = \"127.0.0.1:5353\" }\n");
        let config = crate::parse_str(&text, "t").expect("valid");
        let u = &config.upstreams[0];
        assert!(u.servers.is_empty(), "servers come from DNS");
        let d = u.discover.as_ref().expect("discover");
        assert_eq!(d.name, "api.internal");
        assert_eq!(d.kind, DiscoverKind::Ip { port: 8080 });
        assert_eq!(d.interval, Duration::from_secs(30));
        assert_eq!(d.timeout, Duration::from_secs(2));
        assert!(d.respect_ttl);
        assert_eq!(d.nameserver, Some("127.0.0.1:5353".parse().unwrap()));
        let srv = pool("lb = \"weighted_round_robin\"\ndiscover = { dns = \"_http._tcp.api.internal\", kind = \"SRV\", interval = \"5s\", nameserver = \"10.0.0.2\" }\n");
        let config = crate::parse_str(&srv, "t").expect("valid");
        let d = config.upstreams[0].discover.clone().expect("discover");
        assert_eq!(
            (d.name.as_str(), d.kind),
            ("_http._tcp.api.internal", DiscoverKind::Srv)
        );
        assert_eq!(d.nameserver, Some("10.0.0.2:53".parse().unwrap()));
        assert_eq!(d.interval, Duration::from_secs(5));
    }

    #[test]
    fn discover_errors() {
        let at = |key: &str| format!("upstreams.u.discover.{key}");
        let both = pool(
            "servers = [{ addr = \"127.0.0.1:1\" }]\ndiscover = { dns = \"a.internal:80\" }\n",
        );
        check(
            &both,
            "upstreams.u.servers",
            5,
            "cannot list servers too",
            "remove servers",
        );
        check(
            &pool("discover = { kind = \"SRV\" }\n"),
            &at("dns"),
            5,
            "no dns name",
            "dns = ",
        );
        check(
            &pool("discover = { dns = \"a.internal\" }\n"),
            &at("dns"),
            5,
            "has no port",
            "host:port",
        );
        check(
            &pool("discover = { dns = \"10.0.0.1:80\" }\n"),
            &at("dns"),
            5,
            "is an IP address",
            "servers = ",
        );
        check(
            &pool("discover = { dns = \"a..b:80\" }\n"),
            &at("dns"),
            5,
            "not a valid DNS name",
            "labels",
        );
        let srv_port = pool("discover = { dns = \"_h._tcp.a:80\", kind = \"SRV\" }\n");
        check(&srv_port, &at("dns"), 5, "has a port", "SRV name alone");
        let kind = pool("discover = { dns = \"a.internal:80\", kind = \"A\" }\n");
        check(
            &kind,
            &at("kind"),
            5,
            "unknown discover kind \"A\"",
            "\"A/AAAA\"",
        );
        let ns = pool("discover = { dns = \"a.internal:80\", nameserver = \"dns.local\" }\n");
        check(
            &ns,
            &at("nameserver"),
            5,
            "not an IP address",
            "/etc/resolv.conf",
        );
        let interval = pool("discover = { dns = \"a.internal:80\", interval = \"0s\" }\n");
        check(&interval, &at("interval"), 5, "greater than 0", "30s");
    }
}
