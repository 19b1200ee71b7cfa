//! `weir demo`: three echo backends on loopback and Weir in front of them, round robin,
//! over HTTP and HTTPS from one listener (a certificate for `localhost` and 127.0.0.1 from the internal CA,
//! `internal_ca`, made once in `ca_storage` and reused by later demos, so a client told to
//! trust it keeps trusting). The config is generated as TOML and goes through the same
//! parser as a user's file.

use std::path::PathBuf;

use weir_testkit::Backend;

use crate::run::Running;

/// The demo CA's default directory: per user (`$XDG_DATA_HOME/weir/demo-ca`, else
/// `$HOME/.local/share/weir/demo-ca`), never a fixed path in the shared temporary
/// directory, where another user could plant a CA key the demo would then trust.
/// An existing one must be this user's with mode 0700.
pub fn default_ca_storage() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".local/share"))
            .ok_or_else(|| {
                anyhow::anyhow!("neither XDG_DATA_HOME nor HOME is set: pass --ca-storage DIR")
            })?,
    };
    let dir = base.join("weir/demo-ca");
    if let Ok(meta) = std::fs::symlink_metadata(&dir) {
        use std::os::unix::fs::MetadataExt;
        let euid = weir_core::sys::effective_uid();
        if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
            anyhow::bail!(
                "{}: the demo CA directory must be a directory owned by this user with mode \
                 0700 (chmod 700 it, remove it, or pass --ca-storage DIR)",
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// The demo's three loopback ports (0: any free one).
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// Plain HTTP.
    pub http: u16,
    /// HTTPS, from the internal CA.
    pub https: u16,
    /// The admin API.
    pub admin: u16,
}

pub fn run(ports: Ports, ca_storage: PathBuf) -> anyhow::Result<()> {
    let signals = crate::run::Signals::install()?;
    let backends: Vec<Backend> = (1..=3)
        .map(|i| Backend::echo(&format!("echo-{i}")))
        .collect();
    let servers: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ addr = \"{}\" }}", b.addr()))
        .collect();
    let tls = format!(
        "[listeners.tls]\ninternal_ca = {{ storage = {:?} }}\n",
        ca_storage.display().to_string()
    );
    let toml = demo_config(ports, &tls, &servers.join(", "));
    let config = weir_config::parse_str(&toml, "demo.toml")?;
    let running = Running::start(config, None, toml.clone())?;
    let addrs = running.proxy.listener_addrs("demo");
    let addr = |plain: bool| addrs.iter().find(|b| b.plain_http == plain).map(|b| b.addr);
    let proxy = addr(true).map_or_else(String::new, |a| a.to_string());
    let admin = running
        .admin
        .as_ref()
        .map_or_else(String::new, |a| a.addr().to_string());
    println!("Weir demo: three echo backends, round robin, Weir in front.\n");
    println!("  proxy    http://{proxy}/            try: curl -i http://{proxy}/hello");
    println!("  rewrite  http://{proxy}/cgi/x       (ProxyPass: the backend sees /x)");
    if let Some(https) = addr(false) {
        let port = https.port();
        println!(
            "  https    https://localhost:{port}/   try: curl -i --cacert {} --resolve localhost:{port}:127.0.0.1 https://localhost:{port}/hello",
            ca_storage.join("ca.pem").display()
        );
        println!(
            "           (the demo's own CA, kept in {} for later demos)",
            ca_storage.display()
        );
    }
    println!("  admin    http://{admin}/live  http://{admin}/ready");
    println!("  metrics  http://{admin}/metrics\n");
    println!("The config this demo runs (save it and use `weir run -c FILE`):\n\n{toml}");
    println!("Ctrl-C stops it.");
    let result = running.wait_for_signal_and_stop(signals);
    drop(backends);
    result
}

/// The demo's config: one listener serving its routes over HTTPS and plain HTTP
/// (`http_bind`, with `redirect_https = false` so both answer; `tls`: the
/// `[listeners.tls]` table).
fn demo_config(ports: Ports, tls: &str, servers: &str) -> String {
    let Ports {
        http: port,
        https: tls_port,
        admin: admin_port,
    } = ports;
    format!(
        r#"[server]
workers = "auto"

[admin]
bind = "127.0.0.1:{admin_port}"

[[listeners]]
name = "demo"
bind = "127.0.0.1:{tls_port}"        # HTTPS
http_bind = "127.0.0.1:{port}"       # plain HTTP, the same routes
redirect_https = false
{tls}
[[listeners.routes]]
name = "cgi"
path_prefix = "/cgi/"
rewrite_prefix = "/"
reverse_rewrite = true
upstream = "echo"

[[listeners.routes]]
name = "all"
path_prefix = "/"
upstream = "echo"

[upstreams.echo]
servers = [{servers}]
"#
    )
}
