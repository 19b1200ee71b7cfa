//! Changing the running config: the one diff-and-apply path that SIGHUP, the admin API and
//! `weir ctl apply` all go through.
//!
//! Applying a validated config (1) binds the listeners that are new or whose address (or
//! kind: plain HTTP, TCP, HTTP/3) changed, without listening, so that a bind failure
//! changes nothing and resets no connection; (2) has them all listen once every bind
//! succeeded; (3) fills the metric slots of new objects in every worker's shard; (4)
//! publishes a snapshot built `with_previous`, which keeps server health; (5) tells every
//! worker to accept on the new sockets, then to close the sockets of removed or rebound
//! listeners (an accept loop told to stop first accepts and serves what is queued on its
//! socket); (6) changes `backlog`, `defer_accept` and `max_connections` of the sockets
//! kept in place (a second `listen`, a `setsockopt`, the shared count's limit). Requests
//! in flight finish on the snapshot they started with; the next request on a connection
//! uses the new one, and a connection whose listener is gone closes instead of taking
//! another request.
//!
//! DNS discovery (`cluster::discovery`) changes pools through the same path: an answer is
//! kept here (the servers of a pool with `discover` are the last answer for it), and the
//! running config is applied again with it. Any config applied (a reload, the admin API)
//! gets those servers too, so an edit elsewhere never drops what DNS found.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use weir_config::diff::{diff, Change};
use weir_config::{Bind, Config, Discover, Listener, UpstreamServer};

use crate::listener::cap::{ConnectionCap, ListenerCap};
use crate::listener::{BindSlot, Command};
use crate::metrics::layout::Layout;
use crate::metrics::Metrics;
use crate::server::{bind_per_worker, listen_bound, BoundAddr, InheritedBind, Proxy, StartError};
use crate::snapshot::{Snapshot, TlsPlans};
use crate::worker::Shared;

/// Why a config could not be applied; the running config stays.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The change needs a restart (or `weir upgrade`).
    #[error("{field}: {message}")]
    NotReloadable {
        field: String,
        message: String,
        fix: &'static str,
    },
    #[error(transparent)]
    Bind(#[from] StartError),
    /// A listener's certificate, key or CA file cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::snapshot::ListenerTlsError),
    /// An upstream's TLS client cannot be built (its CA, certificate or key).
    #[error(transparent)]
    UpstreamTls(#[from] crate::connector::tls::TlsSetupError),
}

impl ApplyError {
    /// The config field at fault, for API error bodies.
    pub fn field(&self) -> String {
        match self {
            ApplyError::NotReloadable { field, .. } => field.clone(),
            ApplyError::Bind(StartError::Bind { listener, .. }) => {
                weir_config::listener_field(listener, ".bind")
            }
            ApplyError::Bind(_) => String::new(),
            ApplyError::Tls(e) => e.field.clone(),
            ApplyError::UpstreamTls(e) => format!("upstreams.{}.tls", e.upstream),
        }
    }

    pub fn fix(&self) -> String {
        match self {
            ApplyError::NotReloadable { fix, .. } => fix.to_string(),
            ApplyError::Bind(_) => "use an address that is free on this host".to_string(),
            ApplyError::Tls(e) => {
                format!(
                    "{} (the running certificates stay in use meanwhile)",
                    e.fix()
                )
            }
            ApplyError::UpstreamTls(_) => {
                "give a certificate and key that belong together, in PEM".to_string()
            }
        }
    }
}

/// The sockets of one bind of a listener (at least one per worker; socket `i` goes to
/// worker `i % workers`) and the listener's `max_connections` (counted over all its binds).
pub(crate) struct Bound {
    /// The bind as configured.
    pub bind: Bind,
    /// The address the sockets got (its port, for port 0).
    pub addr: SocketAddr,
    pub sockets: Vec<std::net::TcpListener>,
    /// One UDP socket per worker on `addr` for HTTP/3 (none without `http3`).
    pub quic: Vec<std::net::UdpSocket>,
    pub limit: usize,
}

/// One bind of a listener the workers accept on.
struct Active {
    name: String,
    /// The settings that need new sockets when they change.
    key: SocketKey,
    /// The socket generation (a rebind under the same name gets a new id).
    id: u64,
    addr: SocketAddr,
    plain_http: bool,
    /// Duplicates of the workers' sockets, kept to hand over in a binary upgrade (and to
    /// change their backlog and `defer_accept` in place).
    sockets: Vec<std::net::TcpListener>,
    /// The settings changed on the sockets in place.
    tune: Tune,
}

/// The socket settings a reload changes without new sockets.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tune {
    backlog: u32,
    defer_accept: bool,
}

impl Tune {
    fn of(l: &Listener) -> Tune {
        Tune {
            backlog: l.backlog,
            defer_accept: l.defer_accept,
        }
    }
}

/// What a bind's sockets were made with: a change to any of it binds new sockets. The
/// backlog, `defer_accept` and `max_connections` are not in it: they change in place.
#[derive(Debug, PartialEq)]
struct SocketKey {
    addr: SocketAddr,
    /// A plain-HTTP bind of a TLS listener.
    plain_http: bool,
    /// The accept loop serves TCP (L4).
    tcp: bool,
    /// The bind has UDP sockets for HTTP/3: turning `http3` on or off rebinds.
    quic: bool,
}

fn socket_key(l: &Listener, bind: &Bind) -> SocketKey {
    SocketKey {
        addr: bind.addr,
        plain_http: bind.plain_http,
        tcp: l.tcp().is_some(),
        quic: crate::server::takes_http3(l, bind),
    }
}

/// The control plane's state, behind the `Proxy`'s lock (which also serializes changes).
pub(crate) struct Control {
    layout: Layout,
    workers: Vec<mpsc::UnboundedSender<Command>>,
    active: Vec<Active>,
    next_id: u64,
    /// The open connections of each listener (by metric slot), kept across rebinds: the
    /// connections of the old sockets still count against the new ones' limit.
    caps: HashMap<usize, Arc<ConnectionCap>>,
    /// The last DNS answer of each pool with `discover`, with the `discover` it answered.
    discovered: BTreeMap<String, (Discover, Vec<UpstreamServer>)>,
}

impl Control {
    /// The control state with one command channel per worker; returns the receivers.
    pub fn new(layout: Layout, workers: usize) -> (Control, Vec<mpsc::UnboundedReceiver<Command>>) {
        let (senders, receivers) = (0..workers).map(|_| mpsc::unbounded_channel()).unzip();
        let control = Control {
            layout,
            workers: senders,
            active: Vec::new(),
            next_id: 0,
            caps: HashMap::new(),
            discovered: BTreeMap::new(),
        };
        (control, receivers)
    }

    /// The address of the listener's first bind of its own protocol.
    pub fn addr_of(&self, name: &str) -> Option<SocketAddr> {
        self.active
            .iter()
            .find(|a| a.name == name && !a.plain_http)
            .map(|a| a.addr)
    }

    pub fn addrs_of(&self, name: &str) -> Vec<BoundAddr> {
        self.active
            .iter()
            .filter(|a| a.name == name)
            .map(|a| BoundAddr {
                addr: a.addr,
                plain_http: a.plain_http,
            })
            .collect()
    }

    /// Has every worker accept on `bound`, a bind of `listener` (metric slot `slot`).
    pub fn listen(&mut self, listener: &Listener, slot: usize, bound: Bound) {
        let id = self.next_id;
        self.next_id += 1;
        let mut kept = Vec::new();
        let cap = self.caps.entry(slot).or_default().clone();
        cap.set_limit(bound.limit);
        let mut quic = bound.quic.into_iter();
        for (i, socket) in bound.sockets.into_iter().enumerate() {
            match socket.try_clone() {
                Ok(dup) => kept.push(dup),
                Err(e) => tracing::warn!(error = %e, "cannot keep a socket for upgrades"),
            }
            // A worker that is gone is shutting down; its socket closes with the message.
            let _ = self.workers[i % self.workers.len()].send(Command::Listen {
                id,
                bind: BindSlot {
                    slot,
                    plain_http: bound.bind.plain_http,
                },
                socket,
                cap: ListenerCap { count: cap.clone() },
                quic: quic.next(),
            });
        }
        self.active.push(Active {
            name: listener.name.clone(),
            key: socket_key(listener, &bound.bind),
            id,
            addr: bound.addr,
            plain_http: bound.bind.plain_http,
            sockets: kept,
            tune: Tune::of(listener),
        });
    }

    /// Gives the sockets kept in place the backlog, `defer_accept` and `max_connections`
    /// of `config` (`slots`: each listener's metric slot). On Linux a second `listen`
    /// resizes the accept queue and keeps what is queued; a failure is logged (the socket
    /// keeps its old setting: the config is committed by then).
    fn tune(&mut self, config: &Config, slots: &[usize]) {
        for (l, slot) in config.listeners.iter().zip(slots) {
            if let Some(cap) = self.caps.get(slot) {
                cap.set_limit(l.max_connections);
            }
            let tune = Tune::of(l);
            for a in self
                .active
                .iter_mut()
                .filter(|a| a.name == l.name && a.tune != tune)
            {
                for socket in &a.sockets {
                    let done = crate::listener::listen(socket, tune.backlog).and_then(|()| {
                        crate::listener::set_defer_accept(socket, tune.defer_accept)
                    });
                    if let Err(e) = done {
                        tracing::warn!(listener = %l.name, addr = %a.addr, error = %e, "cannot change the backlog or defer_accept in place");
                    }
                }
                a.tune = tune;
            }
        }
    }

    /// Closes the sockets of every listener `config` no longer has as it is.
    fn stop_stale(&mut self, config: &Config) {
        let (keep, stale): (Vec<Active>, Vec<Active>) =
            std::mem::take(&mut self.active).into_iter().partition(|a| {
                config
                    .listeners
                    .iter()
                    .any(|l| l.name == a.name && l.binds.iter().any(|b| socket_key(l, b) == a.key))
            });
        self.active = keep;
        for a in stale {
            for commands in &self.workers {
                let _ = commands.send(Command::Stop { id: a.id });
            }
        }
    }

    pub fn duplicate_sockets(&self) -> std::io::Result<crate::server::Inherited> {
        self.active
            .iter()
            .map(|a| {
                let sockets = a
                    .sockets
                    .iter()
                    .map(|s| s.try_clone())
                    .collect::<Result<_, _>>()?;
                Ok(InheritedBind {
                    listener: a.name.clone(),
                    plain_http: a.plain_http,
                    sockets,
                })
            })
            .collect()
    }

    /// Closes the duplicates kept for upgrades.
    pub fn forget_sockets(&mut self) {
        for a in &mut self.active {
            a.sockets.clear();
        }
    }

    fn is_active(&self, l: &Listener, bind: &Bind) -> bool {
        self.active
            .iter()
            .any(|a| a.name == l.name && a.key == socket_key(l, bind))
    }

    /// Gives each pool with `discover` the servers of its last answer (none yet: no
    /// servers, which answers 503 until one comes); forgets answers no pool uses.
    fn fill_discovered(&mut self, config: &mut Config) {
        self.discovered.retain(|name, (spec, _)| {
            let pool = config.upstreams.iter().find(|u| &u.name == name);
            pool.is_some_and(|u| u.discover.as_ref() == Some(spec))
        });
        for u in config.upstreams.iter_mut().filter(|u| u.discover.is_some()) {
            u.servers = self
                .discovered
                .get(&u.name)
                .map_or_else(Vec::new, |(_, servers)| servers.clone());
        }
    }
}

/// What applying a config needs, shareable with the threads that change pools (DNS
/// discovery), so that every change takes [`Applier::apply`].
#[derive(Clone)]
pub(crate) struct Applier {
    pub shared: Arc<Shared>,
    pub metrics: Arc<Metrics>,
    /// The control state; its lock serializes changes.
    pub control: Arc<Mutex<Control>>,
}

impl Applier {
    pub fn lock_control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `config` the running config; returns what changed. On error nothing changed.
    pub fn apply(&self, config: Config) -> Result<Vec<Change>, ApplyError> {
        let mut control = self.lock_control();
        self.apply_locked(&mut control, config)
    }

    /// A DNS answer for pool `upstream` (as `discover` describes it): the pool gets
    /// `servers`. `None`: the running config has no such pool any more (or it discovers
    /// something else now), and nothing changed.
    pub fn discovered(
        &self,
        upstream: &str,
        discover: &Discover,
        servers: Vec<UpstreamServer>,
    ) -> Result<Option<Vec<Change>>, ApplyError> {
        let mut control = self.lock_control();
        let config = (*self.shared.snapshot.load().config).clone();
        let current = config.upstreams.iter().find(|u| u.name == upstream);
        if current.and_then(|u| u.discover.as_ref()) != Some(discover) {
            return Ok(None);
        }
        let answer = (discover.clone(), servers);
        control.discovered.insert(upstream.to_owned(), answer);
        self.apply_locked(&mut control, config).map(Some)
    }

    /// `config` with the discovered pools' servers, as it would run.
    pub fn with_discovered(&self, mut config: Config) -> Config {
        let control = self.lock_control();
        for u in config.upstreams.iter_mut().filter(|u| u.discover.is_some()) {
            if let Some((spec, servers)) = control.discovered.get(&u.name) {
                if u.discover.as_ref() == Some(spec) {
                    u.servers = servers.clone();
                }
            }
        }
        config
    }
}

impl Proxy {
    /// Makes `config` the running config; returns what changed. On error nothing changed.
    pub fn apply(&self, config: Config) -> Result<Vec<Change>, ApplyError> {
        self.applier().apply(config)
    }

    /// `config` with the servers DNS discovery found for its pools with `discover`, as
    /// applying it would run it (what a dry run compares with the running config).
    pub fn with_discovered(&self, config: Config) -> Config {
        self.applier().with_discovered(config)
    }
}

impl Applier {
    fn apply_locked(
        &self,
        control: &mut Control,
        mut config: Config,
    ) -> Result<Vec<Change>, ApplyError> {
        control.fill_discovered(&mut config);
        let old = self.shared.snapshot.load_full();
        check_reloadable(&old.config, &config)?;
        // Certificate files are read before anything changes: a bad one leaves all as it was.
        let tls = TlsPlans::build(&config, Some(&old))?;
        // Upstream TLS clients too: a bad one rejects the change before anything moved.
        let upstream_tls = crate::connector::tls::build_all(&config, &old.tls_clients())?;
        let changes = diff(&old.config, &config);
        let binds = bind_new(control, &config, self.shared.workers)?;
        control
            .layout
            .reclaim(|upstream, server| self.metrics.zero_server(upstream, server));
        let slots = control.layout.assign(&config);
        self.metrics.fill(&slots);
        let config = Arc::new(config);
        let listener_slots: Vec<usize> = slots.listeners.iter().map(|l| l.slot).collect();
        let snapshot = Snapshot::with_previous(config.clone(), slots, &old, tls, upstream_tls);
        // Publish first: a connection accepted on a new socket must find its listener in
        // the snapshot. The freed slots wait on the snapshot replaced: `old`, or one the
        // certificate watcher published from it since (it has the same slots, and `old`'s
        // epoch leads to its).
        let replaced = self.shared.publish(snapshot);
        control.layout.wait_for(&replaced.epoch);
        // The new sockets are accepted on before the old ones stop: a rebind of the same
        // address leaves no moment with nobody accepting.
        for (i, bound) in binds {
            // Only the listeners bound now: one whose routes or timeouts changed keeps
            // its sockets and is not `listening` anew.
            tracing::info!(listener = %config.listeners[i].name, addr = %bound.addr, "listening");
            control.listen(&config.listeners[i], listener_slots[i], bound);
        }
        control.stop_stale(&config);
        control.tune(&config, &listener_slots);
        Ok(changes)
    }
}

/// Binds the binds of `config` that no active socket serves (new, or moved to another
/// address or kind), then has them listen. Nothing listens until every bind succeeded: a
/// failure drops sockets no connection was queued on, and changes nothing.
fn bind_new(
    control: &Control,
    config: &Config,
    workers: usize,
) -> Result<Vec<(usize, Bound)>, ApplyError> {
    let mut binds = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        for bind in l.binds.iter().filter(|b| !control.is_active(l, b)) {
            binds.push((i, bind_per_worker(l, bind, workers, Vec::new())?));
        }
    }
    for (i, bound) in &binds {
        listen_bound(&config.listeners[*i], bound)?;
    }
    Ok(binds)
}

/// Settings fixed for the life of the process: the worker count and the access logs (their
/// writers and per-worker buffers are set up at start).
fn check_reloadable(old: &Config, new: &Config) -> Result<(), ApplyError> {
    if old.server.log_format != new.server.log_format {
        return Err(ApplyError::NotReloadable {
            field: "server.log_format".into(),
            message: "the log format is set at start and cannot change while running".into(),
            fix: "keep the running value, or restart (or `weir upgrade`) to change it",
        });
    }
    if old.server.workers != new.server.workers {
        return Err(ApplyError::NotReloadable {
            field: "server.workers".into(),
            message: "the number of workers cannot change while running".into(),
            fix: "keep the running value, or restart (or `weir upgrade`) to change it",
        });
    }
    for l in &new.listeners {
        let before = old.listeners.iter().find(|o| o.name == l.name);
        // A new listener may come without a log; an existing one must keep its own.
        let changed = before.map_or(l.access_log.is_some(), |o| o.access_log != l.access_log);
        if changed {
            return Err(ApplyError::NotReloadable {
                field: weir_config::listener_field(&l.name, ".access_log"),
                message: "access logs are opened at start and cannot change while running".into(),
                fix: "keep the running access_log settings, or restart (or `weir upgrade`) to change them",
            });
        }
    }
    Ok(())
}
