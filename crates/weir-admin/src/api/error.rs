//! API errors: a status and a JSON body naming the field at fault and the fix, the same
//! facts a config-file error gives.

use hyper::StatusCode;
use serde_json::json;
use weir_config::ConfigError;
use weir_core::ApplyError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub field: String,
    pub message: String,
    pub fix: String,
    /// `file:line:col` of a config error in the would-be file.
    pub at: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError {
            status,
            field: String::new(),
            message: message.into(),
            fix: fix.into(),
            at: None,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> ApiError {
        self.field = field.into();
        self
    }

    pub fn not_found(what: &str, fix: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, format!("{what} not found"), fix)
    }

    pub fn bad_request(message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message, fix)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut body = json!({
            "error": self.message,
            "field": self.field,
            "fix": self.fix,
        });
        if let Some(at) = &self.at {
            body["at"] = json!(at);
        }
        body
    }
}

impl From<ConfigError> for ApiError {
    fn from(e: ConfigError) -> ApiError {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            field: e.field.clone(),
            message: e.message.clone(),
            fix: e.fix.clone(),
            at: Some(format!("{}:{}:{}", e.file, e.line, e.column)),
        }
    }
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> ApiError {
        let status = match e {
            ApplyError::NotReloadable { .. } | ApplyError::Tls(_) | ApplyError::UpstreamTls(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApplyError::Bind(_) => StatusCode::CONFLICT,
        };
        ApiError::new(status, e.to_string(), e.fix()).field(e.field())
    }
}
