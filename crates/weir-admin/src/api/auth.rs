//! Who may use the API. With `[admin] token_file`, every `/api` and `/metrics` request
//! needs `Authorization: Bearer TOKEN` (the file is read per request, so rotating the token
//! needs no restart). Without a token, writes are refused unless the admin listener binds
//! a loopback address, where only local users reach it. `/live` and `/ready` stay open for
//! load-balancer probes, which rarely carry credentials.

use hyper::header::AUTHORIZATION;
use hyper::{HeaderMap, StatusCode};
use weir_config::AdminSettings;

use super::error::ApiError;

pub fn check(admin: &AdminSettings, headers: &HeaderMap, write: bool) -> Result<(), ApiError> {
    match &admin.token_file {
        Some(file) => {
            let token = std::fs::read_to_string(file).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot read token_file {}: {e}", file.display()),
                    "make [admin] token_file readable by weir",
                )
            })?;
            let token = token.trim();
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
        None if write && !admin.bind.is_some_and(|a| a.ip().is_loopback()) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "writes need a token when the admin listener is not on loopback",
            "set [admin] token_file, or bind the admin listener to 127.0.0.1",
        )),
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
            header_timeout: std::time::Duration::from_secs(10),
            idle_timeout: std::time::Duration::from_secs(60),
            max_connections: 64,
        }
    }

    #[test]
    fn loopback_without_token_allows_writes_elsewhere_refuses() {
        let h = HeaderMap::new();
        assert!(check(&admin("127.0.0.1:9901", None), &h, true).is_ok());
        assert_eq!(
            check(&admin("0.0.0.0:9901", None), &h, true)
                .unwrap_err()
                .status,
            StatusCode::FORBIDDEN
        );
        assert!(check(&admin("0.0.0.0:9901", None), &h, false).is_ok());
    }

    #[test]
    fn token_is_required_when_configured() {
        let path = std::env::temp_dir().join(format!("weir-token-{}", std::process::id()));
        std::fs::write(&path, "s3cret\n").unwrap();
        let a = admin("127.0.0.1:9901", Some(path.clone()));
        let mut h = HeaderMap::new();
        assert_eq!(
            check(&a, &h, false).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        h.insert(AUTHORIZATION, "Bearer nope".parse().unwrap());
        assert!(check(&a, &h, false).is_err());
        h.insert(AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(check(&a, &h, true).is_ok());
        let _ = std::fs::remove_file(path);
    }
}
