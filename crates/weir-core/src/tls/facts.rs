//! Facts about a certificate, read once when it is loaded: its DNS names, subject, issuer,
//! expiry and SHA-256 fingerprint.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// What a certificate says, in the forms Weir shows and matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// DNS subject alternative names, lower-cased, in certificate order (wildcards as
    /// written, `*.example.com`).
    pub names: Vec<String>,
    /// The subject distinguished name, such as `CN=alice, O=Example`.
    pub subject: String,
    pub issuer: String,
    /// The start of the validity period, in seconds since the Unix epoch.
    pub not_before: i64,
    /// The end of the validity period, in seconds since the Unix epoch.
    pub not_after: i64,
    /// SHA-256 of the DER certificate, 64 lower-case hex digits.
    pub sha256: String,
}

impl CertFacts {
    /// The facts of the DER certificate `der`; an error says why it cannot be read.
    pub fn parse(der: &[u8]) -> Result<CertFacts, String> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
        let names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(name) => Some(name.to_ascii_lowercase()),
                    _ => None,
                })
                .collect(),
            Ok(None) => Vec::new(),
            Err(e) => return Err(format!("unreadable subject alternative names: {e}")),
        };
        Ok(CertFacts {
            names,
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            sha256: sha256_hex(der),
        })
    }
}

/// SHA-256 of `bytes` as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    let mut out = String::with_capacity(64);
    for b in digest.as_ref() {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Lower-case hex digits.
pub(crate) const HEX: &[u8; 16] = b"0123456789abcdef";

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `secs` (Unix time) as `2026-11-24T00:00:00Z`.
pub fn format_utc(secs: i64) -> String {
    let civil = crate::access_log::time::Civil::from_unix(u64::try_from(secs).unwrap_or(0));
    format!("{}Z", civil.iso())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn sha256_of_nothing() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
