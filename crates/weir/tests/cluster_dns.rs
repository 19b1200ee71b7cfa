//! DNS service discovery of pools (`discover = { dns, ... }`) against a real DNS server
//! (the test kit's authoritative `DnsServer` on a UDP port of 127.0.0.1, named as the
//! pool's `nameserver`): a name gaining an address sends traffic to it, losing one drains
//! it (requests in flight finish), servers that stay keep their state, a DNS outage keeps
//! the last answer, a pool that started with DNS down gets its servers soon after DNS is
//! back (not an `interval` later), and SRV records give ports, weights and backups.

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{Conf, Weir, WAIT};
use weir_testkit::dns::{DnsServer, Srv};
use weir_testkit::{wait_until_async, Backend};

const NAME: &str = "api.weir.test";

/// Weir with one route to pool `d`, which discovers `discover` (the `nameserver` added).
fn weir(dns: &DnsServer, lb: &str, discover: &str) -> Weir {
    let discover = discover.replace('}', &format!(", nameserver = \"{}\" }}", dns.addr));
    Conf::new()
        .route("all", "d", &[])
        .table(&format!(
            "[upstreams.d]\nlb = \"{lb}\"\ndiscover = {discover}\n"
        ))
        .start()
}

/// Two echo backends named `a` and `b` on one port of 127.0.0.2 and 127.0.0.3 (an A/AAAA
/// answer gives every address the same port), `b` answering after `b_delay`.
fn two_hosts(b_delay: Duration) -> (Backend, Backend, u16) {
    for _ in 0..20 {
        let a = Backend::echo_at("a", "127.0.0.2:0".parse().unwrap(), Duration::ZERO)
            .expect("bind 127.0.0.2");
        let port = a.addr().port();
        if let Ok(b) = Backend::echo_at("b", SocketAddr::from(([127, 0, 0, 3], port)), b_delay) {
            return (a, b, port);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The `X-Backend` of a GET through Weir, with its status.
async fn backend_of(weir: &Weir) -> (u16, String) {
    let mut client = weir.client().await;
    let r = client.get("/", "test").await.expect("response");
    (
        r.status,
        r.header("x-backend").unwrap_or_default().to_string(),
    )
}

/// Which backends `n` requests reached.
async fn spread(weir: &Weir, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let (status, backend) = backend_of(weir).await;
        assert_eq!(status, 200);
        *seen.entry(backend).or_insert(0) += 1;
    }
    seen
}

const SERVERS: &str = "weir_discovery_servers{upstream=\"d\"}";
const FAILED: &str = "weir_discovery_lookups_total{upstream=\"d\",result=\"error\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_come_and_go_with_the_name_and_dns_down_keeps_the_last() {
    let dns = DnsServer::start();
    let (_a, _b, port) = two_hosts(Duration::from_millis(1500));
    dns.set_ips(NAME, &[ip("127.0.0.2")]);
    let weir = weir(
        &dns,
        "round_robin",
        &format!("{{ dns = \"{NAME}:{port}\", interval = \"100ms\", timeout = \"300ms\" }}"),
    );
    // The start waited for the first answer: the pool has its server already.
    assert_eq!(weir.metric(SERVERS), 1);
    assert_eq!(
        spread(&weir, 3).await,
        HashMap::from([("a".to_string(), 3)])
    );
    let kept = weir.proxy().snapshot().upstreams[0].servers[0].clone();

    // Gains an address: traffic reaches it; the server that stayed kept its state.
    dns.set_ips(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    weir.wait_metric(SERVERS, 2).await;
    let plan = &weir.proxy().snapshot().upstreams[0];
    let config = weir.proxy().config();
    let names: Vec<&str> = config.upstreams[0]
        .servers
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        names,
        [format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}")]
    );
    assert!(
        std::sync::Arc::ptr_eq(&plan.servers[0], &kept),
        "health state kept"
    );

    // Requests in flight to b (slow), then b leaves the name: they finish, new ones
    // go to a only.
    let in_flight: Vec<_> = (0..4)
        .map(|_| {
            let addr = weir.addr;
            tokio::spawn(async move {
                let mut client = weir_testkit::Client::connect(addr).await.expect("connect");
                let r = client.get("/", "test").await.expect("response");
                (
                    r.status,
                    r.header("x-backend").unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    let b_busy = wait_until_async(WAIT, || _b.in_flight() > 0).await;
    assert!(b_busy, "a request is in flight to b");
    dns.set_ips(NAME, &[ip("127.0.0.2")]);
    weir.wait_metric(SERVERS, 1).await;
    let mut finished = Vec::new();
    for task in in_flight {
        finished.push(task.await.expect("request task"));
    }
    assert!(
        finished.iter().all(|(status, _)| *status == 200),
        "{finished:?}"
    );
    assert!(
        finished.iter().any(|(_, backend)| backend == "b"),
        "{finished:?}"
    );
    assert_eq!(
        spread(&weir, 4).await,
        HashMap::from([("a".to_string(), 4)])
    );

    // DNS stops answering: the lookups fail, the last answer stays.
    dns.set_down(true);
    let failed = wait_until_async(WAIT, || weir.metric_now(FAILED).unwrap_or(0) >= 2).await;
    assert!(failed, "lookups fail:\n{}", weir.metrics_text());
    assert_eq!(weir.metric(SERVERS), 1);
    assert_eq!(
        spread(&weir, 3).await,
        HashMap::from([("a".to_string(), 3)])
    );
    // Back: the next answer applies again.
    dns.set_ips(NAME, &[ip("127.0.0.3")]);
    dns.set_down(false);
    let moved = wait_until_async(WAIT, || {
        let config = weir.proxy().config();
        config.upstreams[0]
            .servers
            .iter()
            .any(|s| s.name.starts_with("127.0.0.3"))
    })
    .await;
    assert!(moved, "the pool follows DNS again");
    assert_eq!(
        spread(&weir, 2).await,
        HashMap::from([("b".to_string(), 2)])
    );
}

/// DNS down as Weir starts: the pool has no servers (503); DNS back, the next lookup comes
/// after a short backoff, not the hour of `interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_started_with_dns_down_gets_its_servers_once_dns_answers() {
    let dns = DnsServer::start();
    let backend = Backend::echo("a");
    dns.set_ips(NAME, &[ip("127.0.0.1")]);
    dns.set_down(true);
    let port = backend.addr().port();
    let weir = weir(
        &dns,
        "round_robin",
        &format!("{{ dns = \"{NAME}:{port}\", interval = \"1h\", timeout = \"200ms\" }}"),
    );
    assert_eq!(weir.metric_now(SERVERS).unwrap_or(0), 0);
    assert_eq!(backend_of(&weir).await.0, 503);
    dns.set_down(false);
    weir.wait_metric(SERVERS, 1).await;
    assert_eq!(
        spread(&weir, 2).await,
        HashMap::from([("a".to_string(), 2)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_ports_weights_and_backups() {
    let dns = DnsServer::start();
    let (heavy, light, backup) = (
        Backend::echo("heavy"),
        Backend::echo("light"),
        Backend::echo("backup"),
    );
    dns.set_ips("host.weir.test", &[ip("127.0.0.1")]);
    let srv = |priority, weight, backend: &Backend| Srv {
        priority,
        weight,
        port: backend.addr().port(),
        target: "host.weir.test".to_string(),
    };
    dns.set_srv(
        "_http._tcp.api.weir.test",
        &[srv(10, 3, &heavy), srv(10, 1, &light), srv(20, 5, &backup)],
    );
    let weir = weir(
        &dns,
        "weighted_round_robin",
        "{ dns = \"_http._tcp.api.weir.test\", kind = \"SRV\", interval = \"1h\" }",
    );
    let config = weir.proxy().config();
    let servers: Vec<(u16, u32, bool)> = config.upstreams[0]
        .servers
        .iter()
        .map(|s| (s.addr.port(), s.weight, s.backup))
        .collect();
    assert_eq!(servers.len(), 3, "{servers:?}");
    for (backend, weight, is_backup) in [(&heavy, 3, false), (&light, 1, false), (&backup, 5, true)]
    {
        assert!(
            servers.contains(&(backend.addr().port(), weight, is_backup)),
            "{servers:?}"
        );
    }
    let seen = spread(&weir, 40).await;
    assert_eq!(seen.get("heavy"), Some(&30), "{seen:?}");
    assert_eq!(seen.get("light"), Some(&10), "{seen:?}");
    assert_eq!(
        seen.get("backup"),
        None,
        "backups wait for the primaries: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respect_ttl_looks_up_again_when_the_answer_expires() {
    let dns = DnsServer::start();
    let backend = Backend::echo("a");
    dns.set_ips(NAME, &[ip("127.0.0.1")]);
    dns.set_ttl(1);
    let port = backend.addr().port();
    let weir = weir(
        &dns,
        "round_robin",
        &format!("{{ dns = \"{NAME}:{port}\", interval = \"1h\", respect_ttl = true }}"),
    );
    let before = dns.answered();
    // With a one-hour interval, only the one-second TTL brings another lookup.
    let again = wait_until_async(WAIT, || dns.answered() > before).await;
    assert!(again, "looked up again within the TTL");
    assert_eq!(
        spread(&weir, 1).await,
        HashMap::from([("a".to_string(), 1)])
    );
}
