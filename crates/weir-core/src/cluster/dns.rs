//! DNS lookups for pool discovery: the resolver of a `discover` (its `nameserver`, or the
//! system's `/etc/resolv.conf`) and the servers an answer names.
//!
//! The resolver keeps no cache: every lookup asks the nameserver, and `respect_ttl`
//! decides how soon the next one is. A/AAAA answers give one server per address on the
//! configured port (weight 1); SRV answers one server per address of each target, on the
//! record's port, weighted by the record's weight (0 counts as 1), and the records of the
//! lowest priority are the primary group, the others backups. Servers are named by their
//! socket address, so one that stays across answers keeps its health state.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use weir_config::{Discover, DiscoverKind, UpstreamServer};

/// The highest server weight a config may give (SRV weights are capped to it).
const MAX_WEIGHT: u32 = 1000;

/// What one lookup found.
#[derive(Debug)]
pub struct Answer {
    /// Sorted by name, no two alike.
    pub servers: Vec<UpstreamServer>,
    /// How long the answer may be kept (its records' lowest TTL).
    pub ttl: Duration,
}

/// The resolver `discover` asks.
pub fn resolver(discover: &Discover) -> Result<TokioResolver, String> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = match discover.nameserver {
        Some(addr) => {
            let mut server = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut server.connections {
                c.port = addr.port();
            }
            let config = ResolverConfig::from_name_servers(vec![server]);
            TokioResolver::builder_with_config(config, provider)
        }
        None => TokioResolver::builder(provider)
            .map_err(|e| format!("cannot read the system's DNS settings: {e}"))?,
    };
    let options = builder.options_mut();
    options.timeout = discover.timeout;
    options.attempts = 1;
    options.cache_size = 0;
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    builder.build().map_err(|e| e.to_string())
}

/// Looks `discover`'s name up.
pub async fn lookup(resolver: &TokioResolver, discover: &Discover) -> Result<Answer, String> {
    resolver.clear_cache();
    let (servers, ttl) = match discover.kind {
        DiscoverKind::Ip { port } => {
            let found = resolver
                .lookup_ip(discover.name.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let servers = found
                .iter()
                .map(|ip| server(SocketAddr::new(ip, port), 1, false))
                .collect();
            (servers, until(found.valid_until()))
        }
        DiscoverKind::Srv => srv(resolver, &discover.name).await?,
    };
    Ok(finish(servers, ttl))
}

/// The servers of the SRV records of `name`, and the lowest TTL met.
async fn srv(
    resolver: &TokioResolver,
    name: &str,
) -> Result<(Vec<UpstreamServer>, Duration), String> {
    let found = resolver.srv_lookup(name).await.map_err(|e| e.to_string())?;
    let mut ttl = until(found.valid_until());
    let records: Vec<(u16, u16, u16, String)> = found
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((s.priority, s.weight, s.port, s.target.to_ascii())),
            _ => None,
        })
        .collect();
    let primary = records.iter().map(|r| r.0).min();
    let mut servers = Vec::new();
    for (priority, weight, port, target) in &records {
        // "." means "no service here" (RFC 2782).
        if target == "." {
            continue;
        }
        let ips = resolver
            .lookup_ip(target.as_str())
            .await
            .map_err(|e| format!("SRV target {target}: {e}"))?;
        ttl = ttl.min(until(ips.valid_until()));
        let weight = u32::from(*weight).clamp(1, MAX_WEIGHT);
        let backup = Some(*priority) != primary;
        for ip in ips.iter() {
            servers.push(server(SocketAddr::new(ip, *port), weight, backup));
        }
    }
    Ok((servers, ttl))
}

fn server(addr: SocketAddr, weight: u32, backup: bool) -> UpstreamServer {
    UpstreamServer {
        name: named(addr),
        addr,
        weight,
        max_connections: None,
        backup,
        drain: false,
    }
}

/// `ip:port`, IPv6 in brackets, IPv4-mapped IPv6 as IPv4.
fn named(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    SocketAddr::new(ip, addr.port()).to_string()
}

fn until(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Sorted, duplicates (one address in two SRV records) merged: the first kept, a primary
/// before a backup.
fn finish(mut servers: Vec<UpstreamServer>, ttl: Duration) -> Answer {
    servers.sort_by(|a, b| a.name.cmp(&b.name).then(a.backup.cmp(&b.backup)));
    servers.dedup_by(|a, b| a.name == b.name);
    Answer { servers, ttl }
}
