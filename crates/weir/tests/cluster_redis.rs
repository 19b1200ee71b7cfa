//! Shared rate limits (`rate_limit = { ..., shared = "main" }` with `[cluster.redis.main]`)
//! against a real Redis (`redis-server` started on a free port by the test kit): two Weir
//! instances count one limit, and a Redis outage gives `on_error`'s behaviour, a metric,
//! and local limiting meanwhile; `rediss://` with a CA and a client certificate; a password
//! from `password_file`. Skipped with a message where `redis-server` is missing,
//! unless `WEIR_REQUIRE_REDIS` is set (`.ci/run` sets it once Redis is installed).

mod common;

use common::{h2c_client, Conf, Weir, WAIT};
use weir_testkit::certs::TestCa;
use weir_testkit::redis::RedisServer;
use weir_testkit::wait_until_async;

/// A Weir with two workers and the routes `limits` (`(name, rate_limit)`), each answering
/// 200 itself, counting in `redis` with a 50 ms sync.
fn weir(redis: &RedisServer, limits: &[(&str, &str)]) -> Weir {
    weir_with(&format!("url = \"{}\"", redis.url()), limits)
}

/// [`weir`] with `redis_keys` (`url` and any others) for `[cluster.redis.main]`. Its
/// `timeout` is 2 s: a sync is tried when a request counts, so one that timed out (a TLS
/// handshake with a client certificate on a loaded machine took over 300 ms) left Redis
/// down until the next request; a stopped Redis refuses at once whatever the timeout.
fn weir_with(redis_keys: &str, limits: &[(&str, &str)]) -> Weir {
    let mut conf = Conf::new().workers(2).table(&format!(
        "[cluster.redis.main]\n{redis_keys}\nsync_interval = \"50ms\"\ntimeout = \"2s\"\n"
    ));
    for (name, limit) in limits {
        conf = conf.route_keys(
            name,
            &[
                &format!("path_prefix = \"/{name}\""),
                "respond = { status = 200, body = \"ok\" }",
                &format!("rate_limit = {limit}"),
            ],
        );
    }
    conf.start()
}

async fn status(weir: &Weir, path: &str) -> u16 {
    let mut client = weir.client().await;
    client.get(path, "test").await.expect("response").status
}

/// The status of a GET of `path` from an HTTP/2 (h2c) client.
async fn h2_status(weir: &Weir, path: &str) -> u16 {
    let mut client = h2c_client(weir.addr).await.ready().await.expect("h2 ready");
    let uri = format!("http://test{path}");
    let head = http::Request::get(uri).body(()).expect("request");
    let (response, _) = client.send_request(head, true).expect("send");
    response.await.expect("h2 response").status().as_u16()
}

const SYNCS_OK: &str = "weir_redis_syncs_total{redis=\"main\",result=\"ok\"}";
const SYNCS_FAILED: &str = "weir_redis_syncs_total{redis=\"main\",result=\"error\"}";
const UP: &str = "weir_redis_up{redis=\"main\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_count_one_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let limit = r#"{ rate = "1/h", burst = 10, key = "route", shared = "main" }"#;
    let a = weir(&redis, &[("limited", limit)]);
    let b = weir(&redis, &[("limited", limit)]);
    for _ in 0..10 {
        assert_eq!(status(&a, "/limited").await, 200, "within the burst");
    }
    // Redis holds A's ten: the TAT is ten hours ahead (the key expires with it).
    let recorded = wait_until_async(WAIT, || {
        let ms: i64 = redis
            .command("PTTL weir:rl:web/limited:")
            .trim_start_matches(':')
            .parse()
            .unwrap_or(0);
        ms > 9 * 3_600_000 + 1_800_000
    })
    .await;
    assert!(
        recorded,
        "A's count reached Redis: {}",
        redis.command("PTTL weir:rl:web/limited:")
    );
    // B has not counted this key yet: its first request is decided on its own view
    // (the documented overshoot); its sync then brings the fleet's count.
    assert_eq!(status(&b, "/limited").await, 200);
    let synced = wait_until_async(WAIT, || b.metric_now(SYNCS_OK).unwrap_or(0) >= 1).await;
    assert!(synced, "B synced:\n{}", b.metrics_text());
    for _ in 0..5 {
        assert_eq!(
            status(&b, "/limited").await,
            429,
            "the fleet used the burst"
        );
    }
    assert_eq!(status(&a, "/limited").await, 429);
    // Alone, B would have admitted ten: the fleet admitted eleven, not twenty.
    assert_eq!(
        b.metric(
            "weir_rate_limited_total{listener=\"web\",route=\"limited\",protocol=\"HTTP/1.1\"}"
        ),
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_allows_or_denies_and_limits_locally_meanwhile() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let weir = weir(
        &redis,
        &[
            (
                "open",
                r#"{ rate = "1/h", burst = 3, key = "route", shared = "main" }"#,
            ),
            (
                "closed",
                r#"{ rate = "1/h", burst = 100, key = "route", shared = "main", on_error = "deny" }"#,
            ),
        ],
    );
    assert_eq!(status(&weir, "/closed").await, 200);
    weir.wait_metric(UP, 1).await;

    redis.stop();
    // Decided before any sync failed: admitted; its sync fails and marks Redis down.
    assert_eq!(status(&weir, "/closed").await, 200);
    weir.wait_metric(UP, 0).await;
    assert!(weir.metric(SYNCS_FAILED) >= 1);
    assert_eq!(
        status(&weir, "/closed").await,
        503,
        "deny: refused while Redis is down"
    );
    assert_eq!(
        h2_status(&weir, "/closed").await,
        503,
        "deny: an HTTP/2 request is refused alike"
    );
    // allow: limited by this instance's own count, burst 3 then 429.
    for _ in 0..3 {
        assert_eq!(status(&weir, "/open").await, 200);
    }
    assert_eq!(
        status(&weir, "/open").await,
        429,
        "local limiting continues"
    );

    redis.resume();
    // The refused requests keep syncing (reads): once one succeeds, deny lets requests in.
    let deadline = std::time::Instant::now() + WAIT;
    while status(&weir, "/closed").await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "deny lifts once Redis answers:\n{}",
            weir.metrics_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(weir.metric(UP), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_over_tls_with_a_client_certificate() {
    let server_ca = TestCa::new("redis");
    let client_ca = TestCa::new("redis clients");
    let client = client_ca.client("edge-1");
    let Some(redis) = RedisServer::start_tls(&server_ca.leaf(&["localhost"]), &client_ca.cert_path)
    else {
        return;
    };
    let url = redis.tls_url().expect("a TLS port");
    let ca = server_ca.cert_path.display();
    let limit = r#"{ rate = "1/h", burst = 5, key = "route", shared = "main" }"#;
    let with_cert = weir_with(
        &format!(
            "url = \"{url}\"\nca = \"{ca}\"\nclient_cert = {{ cert = \"{}\", key = \"{}\" }}",
            client.cert_path.display(),
            client.key_path.display()
        ),
        &[("limited", limit)],
    );
    assert_eq!(status(&with_cert, "/limited").await, 200);
    with_cert.wait_metric(UP, 1).await;
    // The count went through the TLS port: the plain port sees it.
    let ttl: i64 = redis
        .command("PTTL weir:rl:web/limited:")
        .trim_start_matches(':')
        .parse()
        .unwrap_or(0);
    assert!(ttl > 3_000_000, "one hour ahead, as PTTL: {ttl}");

    // The server asks for a client certificate: without one, Redis counts as down.
    let without = weir_with(
        &format!("url = \"{url}\"\nca = \"{ca}\""),
        &[("limited", limit)],
    );
    assert_eq!(status(&without, "/limited").await, 200, "on_error = allow");
    without.wait_metric(UP, 0).await;
    assert!(without.metric(SYNCS_FAILED) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticates_with_the_password_file() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // A Redis user "edge" with a password; the default user stays open for the test's
    // own commands.
    assert_eq!(redis.command("ACL SETUSER edge on >s3cret ~* +@all"), "+OK");
    let files = weir_testkit::certs::CertDir::new();
    let url = format!("redis://edge@{}", redis.addr);
    let limit = r#"{ rate = "1/h", burst = 5, key = "route", shared = "main" }"#;
    let keys =
        |file: &std::path::Path| format!("url = \"{url}\"\npassword_file = \"{}\"", file.display());
    let good = weir_with(
        &keys(&files.write("good", "s3cret\n")),
        &[("limited", limit)],
    );
    assert_eq!(status(&good, "/limited").await, 200);
    good.wait_metric(UP, 1).await;
    let synced = wait_until_async(WAIT, || good.metric_now(SYNCS_OK).unwrap_or(0) >= 1).await;
    assert!(synced, "synced as edge:\n{}", good.metrics_text());
    // The same user with another password is refused: Redis counts as down.
    let bad = weir_with(&keys(&files.write("bad", "wrong\n")), &[("limited", limit)]);
    assert_eq!(status(&bad, "/limited").await, 200, "on_error = allow");
    bad.wait_metric(UP, 0).await;
    assert!(bad.metric(SYNCS_FAILED) >= 1);
    assert_eq!(bad.metric_now(SYNCS_OK).unwrap_or(0), 0);
}
