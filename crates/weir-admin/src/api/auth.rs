//! Who may use the API. With `[admin] token_file`, every `/api` and `/metrics` request
//! needs `Authorization: Bearer TOKEN`. Without a token, writes are refused unless the
//! admin listener binds a loopback address, where only local users reach it. `/live` and
//! `/ready` stay open for load-balancer probes, which rarely carry credentials. Browsers'
//! requests are checked before this, token or not (`guard`).
//!
//! The token file is read at most once per [`TOKEN_TTL`] ([`TokenCache`]), on tokio's
//! blocking pool: rotating the token needs no restart, and a file on a slow mount delays
//! only the requests that need the token, never the admin thread (`/live`, `/ready`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::AUTHORIZATION;
use hyper::{HeaderMap, StatusCode};
use weir_config::AdminSettings;

use super::error::ApiError;

/// How long a read of the token file is used before the file is read again.
pub const TOKEN_TTL: Duration = Duration::from_secs(1);

/// The last read of the token file: its trimmed content, or why it could not be read.
#[derive(Default)]
pub struct TokenCache {
    last: tokio::sync::Mutex<Option<Read>>,
}

struct Read {
    path: PathBuf,
    at: Instant,
    token: Result<Arc<str>, Arc<str>>,
}

impl TokenCache {
    /// The token in `file`, read again once the last read is [`TOKEN_TTL`] old. One read
    /// at a time: requests arriving meanwhile wait for it rather than start their own.
    async fn token(&self, file: &Path) -> Result<Arc<str>, ApiError> {
        let mut last = self.last.lock().await;
        let fresh = |r: &&Read| r.path == file && r.at.elapsed() < TOKEN_TTL;
        let token = match last.as_ref().filter(fresh) {
            Some(read) => read.token.clone(),
            None => {
                let token = read_token(file.to_owned()).await;
                let at = Instant::now();
                let path = file.to_owned();
                last.insert(Read { path, at, token }).token.clone()
            }
        };
        token.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                e.to_string(),
                "make [admin] token_file readable by weir",
            )
        })
    }
}

async fn read_token(file: PathBuf) -> Result<Arc<str>, Arc<str>> {
    let shown = file.display().to_string();
    let secret = weir_config::named_file::MAX_SECRET_SIZE;
    let read =
        tokio::task::spawn_blocking(move || weir_config::named_file::read_to_string(&file, secret))
            .await;
    match read {
        Ok(Ok(text)) => Ok(Arc::from(text.trim())),
        Ok(Err(e)) => Err(format!("cannot read token_file {shown}: {e}").into()),
        Err(e) => Err(format!("cannot read token_file {shown}: {e}").into()),
    }
}

pub async fn check(
    admin: &AdminSettings,
    cache: &TokenCache,
    headers: &HeaderMap,
    write: bool,
) -> Result<(), ApiError> {
    match &admin.token_file {
        Some(file) => {
            let token = cache.token(file).await?;
            let token = &*token;
            let given = headers
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            match given {
                Some(g) if !token.is_empty() && same(g.as_bytes(), token.as_bytes()) => Ok(()),
                _ => Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing or wrong bearer token",
                    "send Authorization: Bearer <the token in [admin] token_file> (weir ctl --token-file FILE)",
                )),
            }
        }
        None if write
            && !admin
                .bind
                .is_some_and(|a| a.ip().to_canonical().is_loopback()) =>
        {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "writes need a token when the admin listener is not on loopback",
                "set [admin] token_file, or bind the admin listener to 127.0.0.1",
            ))
        }
        None => Ok(()),
    }
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(bind: &str, token_file: Option<std::path::PathBuf>) -> AdminSettings {
        AdminSettings {
            bind: Some(bind.parse().unwrap()),
            token_file,
            allowed_hosts: Vec::new(),
            header_timeout: std::time::Duration::from_secs(10),
            idle_timeout: std::time::Duration::from_secs(60),
            max_connections: 64,
            dashboard: None,
        }
    }

    #[tokio::test]
    async fn loopback_without_token_allows_writes_elsewhere_refuses() {
        let (h, cache) = (HeaderMap::new(), TokenCache::default());
        let check = |bind, write| {
            let a = admin(bind, None);
            let (h, cache) = (&h, &cache);
            async move { check(&a, cache, h, write).await }
        };
        assert!(check("127.0.0.1:9901", true).await.is_ok());
        assert_eq!(
            check("0.0.0.0:9901", true).await.unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        assert!(check("0.0.0.0:9901", false).await.is_ok());
    }

    fn token_file(tag: &str, token: &str) -> PathBuf {
        let name = format!("weir-token-{tag}-{}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, token).unwrap();
        path
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        h
    }

    #[tokio::test]
    async fn token_is_required_when_configured() {
        let path = token_file("required", "s3cret\n");
        let a = admin("127.0.0.1:9901", Some(path.clone()));
        let cache = TokenCache::default();
        let status = check(&a, &cache, &HeaderMap::new(), false).await;
        assert_eq!(status.unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert!(check(&a, &cache, &bearer("nope"), false).await.is_err());
        assert!(check(&a, &cache, &bearer("s3cret"), true).await.is_ok());
        let _ = std::fs::remove_file(path);
    }

    /// The file is read once per TOKEN_TTL, not per request; a rotated token is used once
    /// the last read is that old.
    #[tokio::test]
    async fn the_token_file_is_cached_and_a_rotation_picked_up() {
        let path = token_file("rotated", "old\n");
        let a = admin("127.0.0.1:9901", Some(path.clone()));
        let cache = TokenCache::default();
        assert!(check(&a, &cache, &bearer("old"), false).await.is_ok());
        std::fs::write(&path, "new\n").unwrap();
        let read_at = cache.last.lock().await.as_ref().unwrap().at;
        // Within TOKEN_TTL of the last read the cached token answers (unless this test ran
        // so slowly that the TTL passed: then the new token must already be in use).
        let cached = check(&a, &cache, &bearer("old"), false).await.is_ok();
        assert!(cached || read_at.elapsed() >= TOKEN_TTL);
        // Age the read instead of sleeping through the TTL.
        cache.last.lock().await.as_mut().unwrap().at = Instant::now() - TOKEN_TTL;
        assert!(check(&a, &cache, &bearer("new"), false).await.is_ok());
        assert!(check(&a, &cache, &bearer("old"), false).await.is_err());
        // Another file (a reload changed token_file) is read at once.
        let other = token_file("other", "other\n");
        let b = admin("127.0.0.1:9901", Some(other.clone()));
        assert!(check(&b, &cache, &bearer("other"), false).await.is_ok());
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(other);
    }

    /// Was: a FIFO as token file hung every API request (and the shutdown) behind the
    /// cache's lock; `/dev/zero` was read to about 1 GB per second. Both answer 500 at once.
    #[tokio::test]
    async fn a_token_file_that_is_not_a_regular_file_is_an_error_at_once() {
        let fifo = std::env::temp_dir().join(format!("weir-token-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        for (file, what) in [
            (fifo.clone(), "(a FIFO)"),
            ("/dev/zero".into(), "(a character device)"),
        ] {
            let a = admin("127.0.0.1:9901", Some(file));
            let (cache, token) = (TokenCache::default(), bearer("x"));
            let answer = check(&a, &cache, &token, false);
            let e = tokio::time::timeout(std::time::Duration::from_secs(5), answer)
                .await
                .expect("answered at once")
                .unwrap_err();
            assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(
                e.message.contains(&format!("is not a regular file {what}")),
                "{}",
                e.message
            );
        }
        let _ = std::fs::remove_file(fifo);
    }
}
