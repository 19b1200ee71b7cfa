//! The process's Redis sync of shared rate limits: takes the workers' batches
//! (`shared_limit`), adds them to the fleet's counts in Redis and merges the fleet's
//! state of each key back into its limiter.
//!
//! Redis keeps one key per limit and client key, `PREFIX rl: LISTENER/ROUTE : KEY`,
//! holding the limit's GCRA "theoretical arrival time" in microseconds of Redis's own
//! clock (`TIME`, so instances need no synchronized clocks) and expiring when that time
//! has passed (no state is lost: the key would start afresh anyway). One Lua script call
//! per chunk of keys adds each count (`TAT = max(TAT, now) + count x interval`) and returns
//! how far ahead of now each TAT is; the limiter then holds the later of its own TAT and
//! the fleet's. A failed call (connection refused, timeout) marks the limiters of that
//! Redis down: `on_error = "allow"` limits locally meanwhile, `"deny"` refuses; the
//! counts of the failed sync are dropped, and the next sync reconnects.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, Script};
use tokio::sync::mpsc;
use weir_config::{RateKey, RedisSettings};

use super::shared_limit::{Batch, KeyCount};
use super::ClusterMetrics;
use crate::filters::rate_limit::ip_of;

/// Keys per script call: a call blocks Redis while it runs, so a big batch goes in parts.
const CHUNK: usize = 512;

/// KEYS: the counters; ARGV: per key, the count to add and the limit's interval (µs).
/// Returns per key how far its TAT is ahead of Redis's clock (µs, 0 when not ahead).
const SCRIPT: &str = r#"
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key) or now) or now
  if tat < now then tat = now end
  tat = tat + tonumber(ARGV[2 * i - 1]) * tonumber(ARGV[2 * i])
  local ahead = tat - now
  if ahead > 0 then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil(ahead / 1000) + 1)
  end
  out[i] = ahead
end
return out
"#;

/// Runs the sync until every worker is gone (the process stops).
pub async fn run(mut batches: mpsc::UnboundedReceiver<Vec<Batch>>, metrics: Arc<ClusterMetrics>) {
    let script = Script::new(SCRIPT);
    let mut links: BTreeMap<String, Link> = BTreeMap::new();
    while let Some(mut all) = batches.recv().await {
        // Whatever queued while the last sync ran goes in this one.
        while let Ok(more) = batches.try_recv() {
            all.extend(more);
        }
        let mut by_redis: BTreeMap<String, Vec<Batch>> = BTreeMap::new();
        for batch in all {
            if let Some(shared) = &batch.limiter.shared {
                by_redis
                    .entry(shared.redis.name.clone())
                    .or_default()
                    .push(batch);
            }
        }
        for (name, group) in by_redis {
            let Some(settings) = group[0].limiter.shared.as_ref().map(|s| &s.redis) else {
                continue;
            };
            let link = links.entry(name).or_insert_with(|| Link::new(settings));
            if link.settings != *settings {
                *link = Link::new(settings);
            }
            let result = link.sync(&script, &group).await;
            link.report(result, &group, &metrics);
        }
    }
}

/// One `[cluster.redis.NAME]`: its settings and connection (made on first use, dropped
/// on an error so the next sync reconnects).
struct Link {
    settings: RedisSettings,
    connection: Option<MultiplexedConnection>,
    /// Whether the last sync failed (for the log: one line per transition).
    down: bool,
}

impl Link {
    fn new(settings: &RedisSettings) -> Link {
        Link {
            settings: settings.clone(),
            connection: None,
            down: false,
        }
    }

    async fn connect(&mut self) -> redis::RedisResult<&mut MultiplexedConnection> {
        if self.connection.is_none() {
            let client = client(&self.settings)?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.settings.timeout))
                .set_response_timeout(Some(self.settings.timeout));
            let connected = client.get_multiplexed_async_connection_with_config(&config);
            let connection = tokio::time::timeout(self.settings.timeout, connected)
                .await
                .map_err(|_| timed_out())??;
            self.connection = Some(connection);
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// Sends `group`'s counts and merges the answers into the limiters.
    async fn sync(&mut self, script: &Script, group: &[Batch]) -> redis::RedisResult<()> {
        let entries: Vec<(&Batch, &KeyCount)> = group
            .iter()
            .flat_map(|b| b.counts.iter().map(move |c| (b, c)))
            .collect();
        let prefix = self.settings.prefix.clone();
        let timeout = self.settings.timeout;
        let connection = self.connect().await?;
        for chunk in entries.chunks(CHUNK) {
            let mut call = script.prepare_invoke();
            for (batch, count) in chunk {
                let Some(shared) = &batch.limiter.shared else {
                    continue;
                };
                call.key(redis_key(
                    &prefix,
                    &shared.name,
                    &batch.limiter.config.key,
                    &count.key,
                ));
                call.arg(count.admitted).arg(batch.limiter.interval_us());
            }
            let ahead: Vec<i64> = tokio::time::timeout(timeout, call.invoke_async(connection))
                .await
                .map_err(|_| timed_out())??;
            let now = Instant::now();
            for ((batch, count), ahead) in chunk.iter().zip(ahead) {
                let ahead = Duration::from_micros(u64::try_from(ahead).unwrap_or(0));
                batch.limiter.merge(count.hash, now, ahead);
            }
        }
        Ok(())
    }

    /// Marks the group's limiters up or down, counts and logs the outcome.
    fn report(
        &mut self,
        result: redis::RedisResult<()>,
        group: &[Batch],
        metrics: &ClusterMetrics,
    ) {
        let name = &self.settings.name;
        let failed = result.is_err();
        for batch in group {
            if let Some(shared) = &batch.limiter.shared {
                shared.set_down(failed);
            }
        }
        metrics.redis_sync(name, !failed);
        match result {
            Err(e) => {
                self.connection = None;
                if !self.down {
                    tracing::warn!(
                        redis = %name,
                        error = %e,
                        "redis unreachable: shared rate limits count locally (on_error = \"allow\") or refuse (\"deny\") until it answers"
                    );
                }
            }
            Ok(()) if self.down => {
                tracing::info!(redis = %name, "redis reachable again: shared rate limits count across the fleet")
            }
            Ok(()) => {}
        }
        self.down = failed;
    }
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer within the redis timeout",
    ))
}

/// The client of `settings` (TLS with its CA and client certificate for `rediss://`), with
/// the password of its `password_file`, read now: a rotated password is used from the next
/// connect.
fn client(settings: &RedisSettings) -> redis::RedisResult<Client> {
    let mut info = settings.url.as_str().into_connection_info()?;
    if let Some(file) = &settings.password_file {
        let secret = weir_config::named_file::MAX_SECRET_SIZE;
        let password = weir_config::named_file::read_to_string(file, secret)?;
        let auth = info
            .redis_settings()
            .clone()
            .set_password(password.trim_end_matches(['\r', '\n']));
        info = info.set_redis_settings(auth);
    }
    if settings.ca.is_none() && settings.client_cert.is_none() {
        return Client::open(info);
    }
    let certs = redis::TlsCertificates {
        client_tls: settings
            .client_cert
            .as_ref()
            .map(|c| redis::ClientTlsConfig {
                client_cert: c.cert.contents.clone(),
                client_key: c.key.contents.clone(),
            }),
        root_cert: settings.ca.as_ref().map(|c| c.contents.clone()),
    };
    Client::build_with_tls(info, certs)
}

/// `PREFIX rl: NAME : KEY`, the key a client address written as text.
fn redis_key(prefix: &str, name: &str, kind: &RateKey, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + name.len() + key.len() + 48);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(b"rl:");
    out.extend_from_slice(name.as_bytes());
    out.push(b':');
    match kind {
        RateKey::ClientIp => out.extend_from_slice(ip_of(key).to_string().as_bytes()),
        RateKey::Route => {}
        RateKey::Header(_) => out.extend_from_slice(key),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redis_key;
    use weir_config::RateKey;

    #[test]
    fn keys_name_the_limit_and_the_client() {
        let key = redis_key("weir:", "web/api", &RateKey::ClientIp, &[10, 0, 0, 7]);
        assert_eq!(key, b"weir:rl:web/api:10.0.0.7");
        let v6 = redis_key("p:", "l/r", &RateKey::ClientIp, &[0; 16]);
        assert_eq!(v6, b"p:rl:l/r:::");
        assert_eq!(redis_key("w:", "l/r", &RateKey::Route, b""), b"w:rl:l/r:");
        let header = RateKey::Header("X-Key".into());
        assert_eq!(redis_key("w:", "l/r", &header, b"abc"), b"w:rl:l/r:abc");
    }
}
