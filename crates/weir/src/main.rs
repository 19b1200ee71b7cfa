//! The `weir` binary: command line, signals and process lifetime. `anyhow` lives only here.

mod ctl;
mod demo;
mod explain;
mod generate;
mod notify;
mod run;
mod upgrade;

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

/// Weir: a reverse proxy and load balancer.
#[derive(Parser)]
#[command(name = "weir", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy with a config file.
    Run {
        /// Path to the TOML config file.
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
        /// Set by `weir upgrade` on the new process: where to take the sockets from.
        #[arg(long, hide = true)]
        upgrade_from: Option<PathBuf>,
    },
    /// Zero-downtime binary upgrade of a running weir (the same as `kill -USR2 PID`): it
    /// starts the binary installed at its path, hands it the listening sockets, and drains.
    Upgrade {
        /// The running weir's process id.
        #[arg(long)]
        pid: u32,
    },
    /// Validate a config file: exit 0 with a summary, or print where and what is wrong.
    Check {
        /// Path to the TOML config file.
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
    },
    /// Read and change a running Weir through its admin API.
    Ctl(ctl::Ctl),
    /// Start three echo backends and Weir in front of them (round robin). Nothing to install.
    Demo {
        /// Port of the demo proxy listener on 127.0.0.1.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Port of the demo HTTPS listener on 127.0.0.1.
        #[arg(long, default_value_t = 8443)]
        tls_port: u16,
        /// Port of the admin listener on 127.0.0.1.
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
        /// Directory of the demo's internal CA (made once, reused by later demos);
        /// default: $XDG_DATA_HOME/weir/demo-ca, else $HOME/.local/share/weir/demo-ca
        /// (refused unless owned by this user with mode 0700).
        #[arg(long)]
        ca_storage: Option<PathBuf>,
    },
    /// Print the shell completion script for bash, zsh or fish.
    Completions {
        #[arg(value_enum)]
        shell: generate::Shell,
    },
    /// Print the man page (roff): `weir man > weir.1`.
    Man,
    /// Print the JSON Schema of the config file, for editors (Taplo, Even Better TOML).
    Schema,
}

/// mimalloc instead of glibc malloc: an h2c stream runs 7 % fewer instructions (34.3k vs
/// 36.8k, callgrind) and takes a fifth of the page faults; see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's collection of the calling thread's heap (in the static mimalloc the
    /// `mimalloc` crate links; its `-sys` crate declares it only behind a feature that
    /// would pull in another crate for this one line).
    fn mi_collect(force: bool);
}

/// Called by each worker every `weir_core::memory::TRIM_INTERVAL`: mimalloc keeps freed
/// pages for reuse and purges them only when the thread that freed them allocates again,
/// so a worker idle after a burst would sit on them for good (issue 24: ~80 MiB after a
/// zero-window attack). Not forced: it frees the thread's empty pages and returns those
/// freed over a second ago to the system; pages in use stay.
fn release_freed_memory() {
    // SAFETY: mi_collect takes no pointer and may be called from any thread at any time.
    unsafe { mi_collect(false) }
}

fn main() -> std::process::ExitCode {
    weir_core::memory::set_release(release_freed_memory);
    let cli = Cli::parse();
    run::init_logging(match &cli.command {
        Command::Run { config, .. } => Some(config.as_path()),
        _ => None,
    });
    let result = match cli.command {
        Command::Run {
            config,
            upgrade_from,
        } => run::run_file(&config, upgrade_from.as_deref()),
        Command::Upgrade { pid } => upgrade::kill(pid, libc::SIGUSR2)
            .map_err(|e| anyhow::anyhow!("cannot signal process {pid}: {e}")),
        Command::Check { config } => run::check_file(&config),
        Command::Demo {
            port,
            tls_port,
            admin_port,
            ca_storage,
        } => match ca_storage.map_or_else(demo::default_ca_storage, Ok) {
            Ok(ca_storage) => demo::run(
                demo::Ports {
                    http: port,
                    https: tls_port,
                    admin: admin_port,
                },
                ca_storage,
            ),
            Err(e) => Err(e),
        },
        Command::Ctl(args) => ctl::run(args),
        Command::Completions { shell } => generate::completions(shell, Cli::command()),
        Command::Man => generate::man(Cli::command()),
        Command::Schema => generate::schema(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
