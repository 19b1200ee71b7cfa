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

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

pub fn check_file(path: &Path) -> anyhow::Result<()> {
    let config = weir_config::load_file(path)?;
    println!("{}: OK: {}", path.display(), config.summary());
    Ok(())
}

pub fn run_file(path: &Path) -> anyhow::Result<()> {
    let (config, text) = weir_config::load_file_with_text(path)?;
    // Signal handlers first: a SIGTERM (or fd exhaustion) right after the listeners bind
    // must find them installed.
    let signals = Signals::install()?;
    let running = Running::start(config, Some(path.to_path_buf()), text)?;
    tracing::info!(config = %path.display(), "weir started");
    running.wait_for_signal_and_stop(signals)
}

/// A started data plane plus its admin listener and the config store both change through.
pub struct Running {
    pub proxy: Arc<Proxy>,
    pub admin: Option<Admin>,
    state: Arc<AdminState>,
    store: Arc<Store>,
}

impl Running {
    /// Starts `config`, parsed from `text` (the file at `path`, where API changes persist).
    pub fn start(config: Config, path: Option<PathBuf>, text: String) -> anyhow::Result<Running> {
        let workers = match config.server.workers {
            Workers::Count(n) => n,
            Workers::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let admin_bind = config.admin.bind;
        let proxy = Arc::new(Proxy::start(config, workers)?);
        let store = Arc::new(Store::new(proxy.clone(), path, text));
        let state = Arc::new(AdminState {
            metrics: Some(Box::new(proxy.metrics_renderer())),
            store: Some(store.clone()),
            ..Default::default()
        });
        let admin = match admin_bind {
            Some(bind) => Some(
                Admin::start(bind, state.clone())
                    .with_context(|| format!("admin: cannot bind {bind}"))?,
            ),
            None => None,
        };
        state.ready.store(true, Ordering::Release);
        for l in &proxy.config().listeners {
            log_listening(&proxy, &l.name);
        }
        tracing::info!(workers, "workers started");
        if let Some(admin) = &admin {
            tracing::info!(addr = %admin.addr(), "admin api listening");
        }
        Ok(Running {
            proxy,
            admin,
            state,
            store,
        })
    }

    /// Blocks until SIGTERM or SIGINT, then drains and stops.
    pub fn wait_for_signal_and_stop(self, signals: Signals) -> anyhow::Result<()> {
        let store = self.store.clone();
        signals.wait(move || reload(&store))?;
        tracing::info!("signal received: draining");
        // Tell load balancers polling /ready to stop sending new work while we drain.
        self.state.ready.store(false, Ordering::Release);
        self.proxy.shutdown();
        if let Some(admin) = self.admin {
            admin.stop();
        }
        tracing::info!("stopped");
        Ok(())
    }
}

fn log_listening(proxy: &Proxy, name: &str) {
    if let Some(addr) = proxy.listener_addr(name) {
        tracing::info!(listener = %name, %addr, "listening");
    }
}

/// SIGHUP: re-reads the config file through the same path as the admin API. A rejected
/// file is logged with its `file:line:col` and the running config stays.
fn reload(store: &Store) {
    match store.reload_file() {
        Ok(applied) => {
            let changes: Vec<String> = applied.changes.iter().map(ToString::to_string).collect();
            tracing::info!(version = applied.version, changes = ?changes, "SIGHUP: config reloaded");
            for c in &applied.changes {
                if c.object == "listener" && c.kind != weir_config::diff::ChangeKind::Removed {
                    log_listening(store.proxy(), &c.name[0]);
                }
            }
        }
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
    hup: tokio::signal::unix::Signal,
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
            runtime,
        })
    }

    /// Waits for SIGTERM or SIGINT; SIGUSR1 on the way reopens the access logs (logrotate),
    /// SIGHUP calls `on_hup`.
    fn wait(self, on_hup: impl Fn()) -> anyhow::Result<()> {
        let Signals {
            runtime,
            mut term,
            mut int,
            mut usr1,
            mut hup,
        } = self;
        runtime.block_on(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => return Ok(()),
                    _ = int.recv() => return Ok(()),
                    _ = usr1.recv() => {
                        tracing::info!("SIGUSR1: reopening access logs");
                        weir_core::access_log::reopen();
                    }
                    _ = hup.recv() => on_hup(),
                }
            }
        })
    }
}
