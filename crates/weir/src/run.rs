//! `weir run` and `weir check`: load a config, start the data plane and the admin listener,
//! wait for SIGTERM / SIGINT, drain, exit. SIGHUP reloads the config file, SIGUSR1 reopens
//! the access logs.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use weir_admin::{Admin, AdminState, Store};
use weir_config::{Config, Workers};
use weir_core::Proxy;

use crate::upgrade::{self, Handover, Sockets};

/// The process log on stderr: `WEIR_LOG_FORMAT` (`text` or `json`), else `[server]
/// log_format` of `config` (`weir run`), else text. Text is coloured only when stderr is a
/// terminal and `NO_COLOR` is unset or empty: journald and files get plain lines.
pub fn init_logging(config: Option<&Path>) {
    use std::io::IsTerminal;
    use weir_config::LogFormat;
    // rustls warns about what peers send (an illegal server name, a warning alert): one
    // line per connection that anyone can cause. Handshake failures are counted by reason
    // and logged at debug by Weir instead; `WEIR_LOG=rustls=warn` brings them back.
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rustls=error"));
    let env = std::env::var("WEIR_LOG_FORMAT")
        .ok()
        .filter(|v| !v.is_empty());
    let format = env
        .as_deref()
        .and_then(LogFormat::parse)
        .or_else(|| config.and_then(weir_config::peek_log_format))
        .unwrap_or_default();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            builder
                .with_ansi(std::io::stderr().is_terminal() && !no_color)
                .init();
        }
    }
    if let Some(bad) = env.filter(|v| LogFormat::parse(v).is_none()) {
        tracing::warn!(value = %bad, "WEIR_LOG_FORMAT is not \"text\" or \"json\": ignored");
    }
}

pub fn check_file(path: &Path) -> anyhow::Result<()> {
    let (config, text) = weir_config::load_file_with_text(path)?;
    if config.cluster.etcd.is_some() {
        weir_config::cluster::check_local_file(&text, &path.display().to_string())?;
    }
    let located = |e: weir_core::StartError| start_error(path, &text, e);
    let certs = weir_core::tls::check::check(&config)
        .map_err(|e| located(weir_core::StartError::Tls(e)))?;
    // Builds the upstreams' TLS clients as a start would (a key that does not match its
    // certificate is found here, not at start).
    weir_core::connector::tls::build_all(&config, &[])
        .map_err(|e| located(weir_core::StartError::UpstreamTls(e)))?;
    let mut out = String::new();
    report_check(&mut out, path, &config, &certs)?;
    crate::generate::print(out.as_bytes())
}

/// What `weir check` prints about a valid config: its warnings, summary, resolved paths,
/// implied settings and certificates. Into a buffer, written at once by the caller (a
/// reader that left, `weir check | head -1`, is no error).
fn report_check(
    out: &mut String,
    path: &Path,
    config: &weir_config::Config,
    certs: &[weir_core::tls::check::CertReport],
) -> std::fmt::Result {
    use std::fmt::Write;
    for warning in config.warnings() {
        writeln!(out, "{}: WARNING: {warning}", path.display())?;
    }
    writeln!(out, "{}: OK: {}", path.display(), config.summary())?;
    for p in &config.relative_paths {
        writeln!(
            out,
            "  {} = {:?} -> {}",
            p.field,
            p.written,
            p.resolved.display()
        )?;
    }
    for line in crate::explain::implied(config) {
        writeln!(out, "  {line}")?;
    }
    for cert in certs {
        writeln!(out, "  {cert}")?;
        for warning in &cert.warnings {
            writeln!(
                out,
                "  warning: listener {:?}: {}: {warning}",
                cert.listener,
                cert.file.display()
            )?;
        }
    }
    Ok(())
}

/// A start error; one about a file the config names (a certificate) becomes a config
/// error at the key naming it: `file:line:col: field: message (fix: ...)`.
fn start_error(path: &Path, text: &str, e: weir_core::StartError) -> anyhow::Error {
    match e.located() {
        Some((field, fix)) => {
            let file = path.display().to_string();
            weir_config::ConfigError::at_field(&file, text, &field, e.to_string(), fix).into()
        }
        None => e.into(),
    }
}

/// `weir run`; with `upgrade_from`, the new process of a binary upgrade, which starts on
/// the sockets the old process hands over at that unix socket path.
pub fn run_file(path: &Path, upgrade_from: Option<&Path>) -> anyhow::Result<()> {
    let (config, text) = weir_config::load_file_with_text(path)?;
    // Signal handlers first: a SIGTERM (or fd exhaustion) right after the listeners bind
    // must find them installed.
    let signals = Signals::install()?;
    let handover = upgrade_from.map(Handover::receive).transpose()?;
    let (sockets, handover) = match handover {
        Some(h) => {
            let (sockets, ready) = h.split();
            (Some(sockets), Some(ready))
        }
        None => (None, None),
    };
    let running = match config.cluster.etcd.clone() {
        None => Running::start_with(config, Some(path.to_path_buf()), text, sockets)?,
        Some(etcd) => Running::start_member(etcd, path, text, sockets)?,
    };
    // Before the old process of an upgrade is told to drain: systemd must know the new
    // main pid by the time the old one exits.
    crate::notify::ready();
    if let Some(ready) = handover {
        ready.ready().context("telling the old process to drain")?;
        tracing::info!(
            pid = std::process::id(),
            "upgrade: took over the listening sockets"
        );
    }
    tracing::info!(config = %path.display(), "weir started");
    running.wait_for_signal_and_stop(signals)
}

/// A started data plane plus its admin listener and the config store both change through.
pub struct Running {
    pub proxy: Arc<Proxy>,
    pub admin: Option<Admin>,
    state: Arc<AdminState>,
    store: Arc<Store>,
    /// A fleet member's link to etcd.
    fleet: Option<Arc<weir_cluster::Fleet>>,
    /// This binary's path at start: `weir upgrade` runs whatever is installed there then.
    exe: Option<PathBuf>,
}

impl Running {
    /// Starts `config`, parsed from `text` (the file at `path`, where API changes persist).
    pub fn start(config: Config, path: Option<PathBuf>, text: String) -> anyhow::Result<Running> {
        Running::start_with(config, path, text, None)
    }

    /// Like `start`, on the sockets a binary upgrade handed over.
    pub fn start_with(
        config: Config,
        path: Option<PathBuf>,
        text: String,
        sockets: Option<Sockets>,
    ) -> anyhow::Result<Running> {
        let Sockets {
            listeners,
            admin: admin_socket,
        } = sockets.unwrap_or(Sockets {
            listeners: Vec::new(),
            admin: None,
        });
        let workers = match config.server.workers {
            Workers::Count(n) => n,
            Workers::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let admin_bind = config.admin.bind;
        let proxy =
            Proxy::start_inherited(config, workers, listeners).map_err(|e| match &path {
                Some(p) => start_error(p, &text, e),
                None => e.into(),
            })?;
        let proxy = Arc::new(proxy);
        let store = Arc::new(Store::new(proxy.clone(), path, text));
        let state = Arc::new(AdminState {
            metrics: Some(Box::new(proxy.metrics_renderer())),
            store: Some(store.clone()),
            ..Default::default()
        });
        let inherited_admin = admin_socket.filter(|s| {
            let addr = s.local_addr().ok();
            admin_bind.is_some_and(|b| {
                addr == Some(b) || (b.port() == 0 && addr.is_some_and(|a| a.ip() == b.ip()))
            })
        });
        let admin = match (admin_bind, inherited_admin) {
            (Some(_), Some(socket)) => Some(Admin::start_on(socket, state.clone())?),
            (Some(bind), None) => Some(
                Admin::start(bind, state.clone())
                    .with_context(|| format!("admin: cannot bind {bind}"))?,
            ),
            (None, _) => None,
        };
        state.ready.store(true, Ordering::Release);
        for l in &proxy.config().listeners {
            log_listening(&proxy, &l.name);
        }
        tracing::info!(workers, "workers started");
        if let Some(admin) = &admin {
            let token = proxy.config().admin.token_file.is_some();
            tracing::info!(addr = %admin.addr(), token, "admin api listening");
            if !token && admin.addr().ip().to_canonical().is_loopback() {
                // Not a warning: a loopback API without a token is the default of a
                // config with no `[admin]`, as Caddy's is. But who can use it is said.
                tracing::info!(
                    "admin api has no token_file: every local user may change the config \
                     through it; set [admin] token_file to restrict it (the package does)"
                );
            }
        }
        if let Some(warning) = proxy.config().admin.exposure_warning() {
            tracing::warn!("{warning}");
        }
        Ok(Running {
            proxy,
            admin,
            state,
            store,
            fleet: None,
            exe: std::env::current_exe().ok(),
        })
    }

    /// A fleet member (`[cluster] etcd` in the local file at `path`, whose `text` holds
    /// only per-node sections): starts with the shared objects from etcd (or the snapshot
    /// when etcd cannot be reached), then follows them.
    fn start_member(
        etcd: weir_config::cluster::EtcdCluster,
        path: &Path,
        text: String,
        sockets: Option<Sockets>,
    ) -> anyhow::Result<Running> {
        weir_config::cluster::check_local_file(&text, &path.display().to_string())?;
        let (fleet, initial) = weir_cluster::Fleet::connect(etcd, text, Some(path.to_path_buf()))?;
        let mut running = Running::start_with(
            initial.config,
            Some(path.to_path_buf()),
            initial.text,
            sockets,
        )?;
        fleet.run(running.store.clone());
        running.fleet = Some(fleet);
        Ok(running)
    }

    /// Blocks until SIGTERM or SIGINT (or a successful upgrade), then drains and stops.
    pub fn wait_for_signal_and_stop(mut self, signals: Signals) -> anyhow::Result<()> {
        let store = self.store.clone();
        let exit = signals.wait(|| reload(&store), || self.upgrade())?;
        if matches!(exit, Exit::Upgraded { .. }) {
            // The new process serves the admin socket now; API writes must reach it.
            if let Some(admin) = self.admin.take() {
                admin.stop();
            }
        }
        tracing::info!("signal received: draining");
        if exit == Exit::Stop {
            // Not after an upgrade: the service goes on in the new process.
            crate::notify::stopping();
        }
        // Tell load balancers polling /ready to stop sending new work while we drain.
        self.state.ready.store(false, Ordering::Release);
        if let Some(fleet) = self.fleet.take() {
            fleet.stop();
        }
        self.proxy.shutdown();
        if let Some(admin) = self.admin {
            admin.stop();
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// SIGUSR2: hands the sockets to a new process; its pid once it runs and this one
    /// should drain. A failure is logged and this process keeps serving.
    fn upgrade(&self) -> Option<u32> {
        let result = (|| {
            let exe = self
                .exe
                .as_deref()
                .context("this binary's path is unknown")?;
            let config = self
                .store
                .path()
                .context("no config file (weir run -c FILE)")?;
            let sockets = Sockets {
                listeners: self.proxy.listening_sockets()?,
                admin: self.admin.as_ref().map(Admin::socket).transpose()?,
            };
            self.store.set_frozen(true);
            upgrade::hand_over(exe, config, sockets)
        })();
        match result {
            Ok(pid) => {
                tracing::info!(
                    new_pid = pid,
                    "upgrade: the new process is ready; draining this one"
                );
                Some(pid)
            }
            Err(e) => {
                self.store.set_frozen(false);
                tracing::error!(error = %format!("{e:#}"), "upgrade failed; this process keeps serving");
                None
            }
        }
    }
}

fn log_listening(proxy: &Proxy, name: &str) {
    for bound in proxy.listener_addrs(name) {
        if bound.plain_http {
            tracing::info!(listener = %name, addr = %bound.addr, "listening (http_bind)");
        } else {
            tracing::info!(listener = %name, addr = %bound.addr, "listening");
        }
    }
}

/// SIGHUP: re-reads the config file through the same path as the admin API. The store
/// logs the change (`config changed by=SIGHUP`) and the data plane each socket it bound
/// (`listening`); a rejected file is logged with its `file:line:col` and the running
/// config stays.
fn reload(store: &Store) {
    match store.reload_file() {
        Ok(_) => {}
        Err(e) => tracing::error!(
            at = e.at.as_deref().unwrap_or(""),
            field = %e.field,
            error = %e.message,
            fix = %e.fix,
            "SIGHUP: config rejected; the running config stays"
        ),
    }
}

/// The process's signal handlers, installed before anything else can fail.
pub struct Signals {
    runtime: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// Why the signal wait ended.
#[derive(Debug, PartialEq, Eq)]
enum Exit {
    Stop,
    /// Handed over to the process `new_pid`.
    Upgraded {
        new_pid: u32,
    },
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _guard = runtime.enter();
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            usr1: signal(SignalKind::user_defined1())?,
            hup: signal(SignalKind::hangup())?,
            usr2: signal(SignalKind::user_defined2())?,
            runtime,
        })
    }

    /// Waits for SIGTERM or SIGINT; SIGUSR1 on the way reopens the access logs (logrotate),
    /// SIGHUP calls `on_hup`, SIGUSR2 `on_usr2` (an upgrade: the new pid ends the wait, and
    /// SIGHUPs from then on are passed on to it: see [`forward_hup`]).
    fn wait(self, on_hup: impl Fn(), on_usr2: impl Fn() -> Option<u32>) -> anyhow::Result<Exit> {
        let Signals {
            runtime,
            mut term,
            mut int,
            mut usr1,
            mut usr2,
            mut hup,
        } = self;
        let exit = runtime.block_on(async {
            loop {
                tokio::select! {
                    _ = term.recv() => return Exit::Stop,
                    _ = int.recv() => return Exit::Stop,
                    _ = usr2.recv() => {
                        tracing::info!("SIGUSR2: upgrading");
                        crate::notify::reloading("upgrading");
                        if let Some(new_pid) = on_usr2() {
                            return Exit::Upgraded { new_pid };
                        }
                        crate::notify::ready();
                    }
                    _ = usr1.recv() => {
                        tracing::info!("SIGUSR1: reopening access logs");
                        weir_core::access_log::reopen();
                    }
                    _ = hup.recv() => {
                        crate::notify::reloading("reloading");
                        on_hup();
                        crate::notify::ready();
                    }
                }
            }
        });
        if let Exit::Upgraded { new_pid } = exit {
            // The sockets are handed over: this process drains whatever happens here.
            if let Err(e) = forward_hup(runtime, hup, new_pid) {
                tracing::warn!(new_pid, error = %e, "cannot pass SIGHUPs on to the new process while draining; send them there");
            }
        }
        Ok(exit)
    }
}

/// After an upgrade: a SIGHUP this process gets while it drains is meant for the process
/// now serving (an operator's `kill -HUP` of the pid they knew, or one sent during the
/// handover, after the new process read the file: was dropped without a word). It is
/// passed on to `new_pid`, logged, from a thread of its own (the drain blocks this one).
fn forward_hup(
    runtime: tokio::runtime::Runtime,
    mut hup: tokio::signal::unix::Signal,
    new_pid: u32,
) -> std::io::Result<()> {
    let forward = move || {
        runtime.block_on(async {
            while hup.recv().await.is_some() {
                let sent = crate::upgrade::kill(new_pid, libc::SIGHUP);
                match sent {
                    Ok(()) => tracing::info!(new_pid, "SIGHUP while draining after the upgrade: passed on to the new process"),
                    Err(e) => tracing::warn!(new_pid, error = %e, "SIGHUP while draining after the upgrade: cannot pass it on to the new process; send it there"),
                }
            }
        });
    };
    std::thread::Builder::new()
        .name("weir-hup-forward".into())
        .spawn(forward)
        .map(drop)
}
