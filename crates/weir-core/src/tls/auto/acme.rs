//! One ACME order (RFC 8555, through instant-acme) for the names of an [`AutoCerts`]:
//! the account (made once, stored 0600 beside the certificates), the order, a challenge
//! per name answered by Weir itself, the CSR (a new ECDSA P-256 key each time) and the
//! certificate, written to storage and swapped in live.
//!
//! The storage lock is held for the whole order: a second Weir process on the same
//! storage finds it taken and waits, then picks up the certificate the first one wrote.
//! badNonce answers are retried by instant-acme at once (RFC 8555 section 6.5); other
//! failures, rate limits included, go back to the manager's back-off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use weir_config::{Acme, AcmeChallenge};

use super::shared::{self, Challenge, Fence, File};
use super::storage::{self, Lock};
use super::{challenge, AutoCerts};

/// How long the server may take to validate and then to issue, each.
const POLL_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a challenge published to the fleet is given to reach every instance before
/// the ACME server is told to check it.
const FLEET_CHALLENGE_SPREAD: Duration = Duration::from_millis(500);

/// Why an order failed.
#[derive(Debug)]
pub struct OrderError {
    pub message: String,
    /// The server said `rateLimited`: wait long before trying again.
    pub rate_limited: bool,
}

impl From<instant_acme::Error> for OrderError {
    fn from(e: instant_acme::Error) -> OrderError {
        let rate_limited = matches!(&e, instant_acme::Error::Api(p)
            if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:rateLimited"));
        OrderError {
            message: with_causes(&e),
            rate_limited,
        }
    }
}

/// `e` and each of its sources, `: `-separated (hyper says `client error (Connect)`; the
/// reason, such as rustls' `UnknownIssuer`, is three sources down). A source already
/// quoted by the one before is left out.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

impl OrderError {
    /// The message with how to fix it, for the log, the API and `weir ctl get certs`.
    pub fn explained(&self, acme: &Acme) -> String {
        format!("{} (fix: {})", self.message, fix(&self.message, acme))
    }
}

/// How to fix an order that failed with `message`.
fn fix(message: &str, acme: &Acme) -> String {
    let m = message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if has(&["unknownissuer", "invalid peer certificate", "unknown ca"]) {
        return match &acme.directory_ca {
            Some(ca) => format!(
                "the ACME server's HTTPS certificate does not chain to directory_ca ({}): give the root that issued it",
                ca.display()
            ),
            None => "the ACME server's HTTPS certificate is not trusted by this host's roots: set \
                     directory_ca = \"/path/to/its-root.pem\" in the listener's acme table (pebble: \
                     its minica root), or use a directory with a publicly trusted certificate"
                .to_string(),
        };
    }
    if has(&["ratelimited", "rate limit"]) {
        return "the ACME server rate-limits this account or these names: Weir waits at least an \
                hour before the next attempt; see the server's published limits"
            .to_string();
    }
    if has(&[
        "acme:error:connection",
        "acme:error:unauthorized",
        "acme:error:dns",
        "acme:error:incorrectresponse",
        "acme:error:tls",
    ]) {
        let (port, how) = match acme.challenge {
            AcmeChallenge::Http01 => (80, "a Weir HTTP listener (HTTP-01)"),
            AcmeChallenge::TlsAlpn01 => (443, "this TLS listener (TLS-ALPN-01)"),
        };
        return format!(
            "the ACME server could not validate: make {} resolve to this host, reachable from \
             the internet on port {port}, served by {how}",
            acme.domains.join(", ")
        );
    }
    if has(&[
        "connect",
        "dns error",
        "lookup",
        "timed out",
        "refused",
        "unreachable",
    ]) {
        return format!(
            "Weir cannot reach the ACME directory {}: check the URL, DNS, firewalls and any \
             outbound proxy from this host",
            acme.directory
        );
    }
    if has(&["storage", "permission denied", "read-only"]) {
        return format!(
            "make acme.storage ({}) a directory weir's user can write",
            acme.storage.display()
        );
    }
    "see the cause; Weir tries again with back-off (weir ctl get certs shows when)".to_string()
}

impl From<String> for OrderError {
    fn from(message: String) -> OrderError {
        OrderError {
            message,
            rate_limited: false,
        }
    }
}

/// What an attempt came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A new certificate is in use.
    Ordered,
    /// Another process holds the storage lock, or wrote a valid certificate meanwhile.
    NotNeeded,
}

/// Orders a certificate for `auto`'s names as `acme` says.
pub async fn order(auto: &AutoCerts, acme: &Acme) -> Result<Outcome, OrderError> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let Some(_lock) = Lock::try_take(&acme.storage).map_err(|e| io("storage lock", e))? else {
        // Another process is ordering: it writes the certificate we load next time.
        let _ = auto.load_stored();
        return Ok(Outcome::NotNeeded);
    };
    let fence = match shared::get() {
        None => None,
        Some(store) => match shared::lock(store.as_ref(), auto).await? {
            Some(fence) => Some(fence),
            None => return Ok(Outcome::NotNeeded),
        },
    };
    // A process that held the lock before us may have written a fresh certificate.
    if auto.load_stored().is_ok() && !auto.needs_renewal(super::unix_now()) {
        return Ok(Outcome::NotNeeded);
    }
    let account = account(acme).await?;
    let identifiers: Vec<Identifier> = acme.domains.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    let mut pending = Pending::default();
    let result = async {
        authorize(&mut order, acme.challenge, &mut pending, fence.as_ref()).await?;
        let status = order.poll_ready(&polling()).await?;
        if status != OrderStatus::Ready {
            return Err(order_problem(&mut order, status));
        }
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let params =
            rcgen::CertificateParams::new(acme.domains.clone()).map_err(|e| e.to_string())?;
        let csr = params.serialize_request(&key).map_err(|e| e.to_string())?;
        order.finalize_csr(csr.der()).await?;
        let chain = order.poll_certificate(&polling()).await?;
        let key = key.serialize_pem();
        shared::save(auto, fence.as_ref(), chain.as_bytes(), key.as_bytes()).await?;
        Ok(Outcome::Ordered)
    }
    .await;
    pending.clear();
    result
}

fn polling() -> RetryPolicy {
    RetryPolicy::new().timeout(POLL_TIMEOUT)
}

/// The order's error as the server put it, or its status.
fn order_problem(order: &mut instant_acme::Order, status: OrderStatus) -> OrderError {
    match &order.state().error {
        Some(problem) => OrderError::from(instant_acme::Error::Api(problem.clone())),
        None => format!("the order ended {status:?}").into(),
    }
}

/// Sets up the challenge of each pending authorization and tells the server to check it.
async fn authorize(
    order: &mut instant_acme::Order,
    kind: AcmeChallenge,
    pending: &mut Pending,
    fence: Option<&Fence>,
) -> Result<(), OrderError> {
    let wanted = match kind {
        AcmeChallenge::Http01 => ChallengeType::Http01,
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        if authz.status == AuthorizationStatus::Valid {
            continue;
        }
        let name = authz.identifier().to_string();
        let mut handle = authz
            .challenge(wanted.clone())
            .ok_or_else(|| format!("the ACME server offers no {wanted:?} challenge for {name}"))?;
        let key_authorization = handle.key_authorization();
        let published = match kind {
            AcmeChallenge::Http01 => {
                challenge::add_http01(&handle.token, key_authorization.as_str());
                pending.tokens.push(handle.token.clone());
                Challenge::Http01 {
                    token: handle.token.clone(),
                    key_authorization: key_authorization.as_str().to_owned(),
                }
            }
            AcmeChallenge::TlsAlpn01 => {
                let digest = key_authorization.digest().as_ref().to_vec();
                challenge::add_tls_alpn01(&name, &digest)?;
                pending.names.push(name.clone());
                Challenge::TlsAlpn01 { name, digest }
            }
        };
        if fence.is_some() {
            shared::publish(fence, published).await?;
            // The other instances set it up from their watch of the store, within
            // milliseconds; the ACME server may ask any of them as soon as it is told.
            tokio::time::sleep(FLEET_CHALLENGE_SPREAD).await;
        }
        handle.set_ready().await?;
    }
    Ok(())
}

/// The challenges this order put up, taken down when it ends however it ends.
#[derive(Default)]
struct Pending {
    tokens: Vec<String>,
    names: Vec<String>,
}

impl Pending {
    fn clear(&mut self) {
        self.tokens
            .drain(..)
            .for_each(|t| challenge::remove_http01(&t));
        self.names
            .drain(..)
            .for_each(|n| challenge::remove_tls_alpn01(&n));
    }
}

/// The stored account for `acme.directory`, or a new one (then stored, 0600).
async fn account(acme: &Acme) -> Result<Account, OrderError> {
    if let Some(ca) = &acme.directory_ca {
        // The ACME client reads the file itself, with no limit: checked within the limits
        // of every file the config names first, as it may have changed since the load.
        use weir_config::named_file::{read, MAX_FILE_SIZE};
        read(ca, MAX_FILE_SIZE)
            .map_err(|e| format!("cannot read directory_ca {}: {e}", ca.display()))?;
    }
    let builder = || match &acme.directory_ca {
        Some(ca) => Account::builder_with_root(ca),
        None => Account::builder(),
    };
    let path = account_file(&acme.storage, &acme.directory);
    let name = shared::file_name(&path);
    if let (Some(store), false) = (shared::get(), path.exists()) {
        // The fleet's account, made by whichever instance ordered first.
        if let Some(Some(json)) = store.read(std::slice::from_ref(&name)).await?.pop() {
            storage::write(&path, &json, true).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    if let Ok(text) = super::super::pem::read(&path) {
        let credentials: AccountCredentials = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: unreadable account: {e}", path.display()))?;
        return Ok(builder()?.from_credentials(credentials).await?);
    }
    let contact: Vec<&str> = acme.contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contact,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, credentials) = builder()?
        .create(&new, acme.directory.clone(), None)
        .await?;
    let json = serde_json::to_vec(&credentials).map_err(|e| e.to_string())?;
    storage::write(&path, &json, true).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(store) = shared::get() {
        let file = File {
            name,
            contents: json,
        };
        store.write(None, vec![file]).await?;
    }
    tracing::info!(directory = %acme.directory, account = %account.id(), "ACME account created");
    Ok(account)
}

/// One account per directory: its file name carries a digest of the directory URL.
fn account_file(storage: &Path, directory: &str) -> PathBuf {
    let digest = crate::tls::facts::sha256_hex(directory.as_bytes());
    storage.join(format!("account-{}.json", &digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme(directory_ca: Option<&str>) -> Acme {
        Acme {
            domains: vec!["example.com".into()],
            contact: Vec::new(),
            directory: "https://acme.test/dir".into(),
            challenge: AcmeChallenge::Http01,
            storage: PathBuf::from("/var/lib/weir/acme"),
            directory_ca: directory_ca.map(PathBuf::from),
            retry_initial: Duration::from_secs(10),
        }
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);
    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    /// Was: `client error (Connect)`, the reason left in another log line.
    #[test]
    fn the_cause_is_spelled_out_with_a_fix() {
        let tls = Layer("invalid peer certificate: UnknownIssuer", None);
        let io = Layer(
            "invalid peer certificate: UnknownIssuer",
            Some(Box::new(tls)),
        );
        let e = Layer("client error (Connect)", Some(Box::new(io)));
        let message = with_causes(&e);
        assert_eq!(
            message,
            "client error (Connect): invalid peer certificate: UnknownIssuer"
        );
        let error = OrderError::from(message);
        let shown = error.explained(&acme(None));
        assert!(
            shown.contains("UnknownIssuer") && shown.contains("set directory_ca"),
            "{shown}"
        );
        let shown = error.explained(&acme(Some("/etc/pebble.pem")));
        assert!(
            shown.contains("does not chain to directory_ca (/etc/pebble.pem)"),
            "{shown}"
        );
        let refused = OrderError::from(
            "client error (Connect): tcp connect error: Connection refused (os error 111)"
                .to_string(),
        );
        assert!(refused
            .explained(&acme(None))
            .contains("cannot reach the ACME directory https://acme.test/dir"));
        let problem = OrderError::from(
            "API error: urn:ietf:params:acme:error:connection: no route".to_string(),
        );
        assert!(problem
            .explained(&acme(None))
            .contains("make example.com resolve to this host"));
    }
}
