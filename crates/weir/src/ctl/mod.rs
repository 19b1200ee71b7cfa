//! `weir ctl`: the admin API from the command line. Reads print tables (or `-o json`);
//! writes print what changed and the new version. Any failure prints the API's message,
//! field and fix, and exits non-zero.

mod cache;
mod cluster;
mod http;
mod table;

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

#[derive(Args)]
pub struct Ctl {
    /// The admin API's URL [default: $WEIR_ADMIN, else [admin] bind of --config, else
    /// http://127.0.0.1:9901].
    #[arg(long, global = true)]
    admin: Option<String>,
    /// File holding the bearer token ([admin] token_file on the server) [default:
    /// $WEIR_ADMIN_TOKEN_FILE, else [admin] token_file of --config].
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// A config file to take the admin address and token file from (its [admin] section)
    /// [default: /etc/weir/weir.toml, the package's, if there and neither --admin nor
    /// $WEIR_ADMIN is given].
    #[arg(short, long, global = true)]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Show the running config, upstreams, listeners, server health or certificates.
    Get {
        #[arg(value_enum)]
        what: What,
        /// For `health`: only this upstream.
        name: Option<String>,
    },
    /// Replace the running config with FILE (TOML or JSON; `-` reads stdin).
    Apply {
        #[arg(short, long)]
        file: String,
    },
    /// Show what applying FILE would change, changing nothing.
    Diff {
        #[arg(short, long)]
        file: String,
    },
    /// Delete an object.
    Delete {
        #[arg(value_enum)]
        kind: Kind,
        name: String,
    },
    /// The recent versions of the running config: when, by whom, what changed.
    History,
    /// Change one server of an upstream.
    Server {
        #[arg(value_enum)]
        action: ServerAction,
        upstream: String,
        addr: String,
        /// For `add` and `weight`.
        weight: Option<u32>,
    },
    /// The HTTP cache: store stats, purge by URL or prefix.
    Cache {
        #[command(subcommand)]
        action: cache::Action,
    },
    /// A fleet's shared objects in etcd, reached through [cluster] etcd of -c FILE.
    Cluster {
        #[command(subcommand)]
        action: cluster::Action,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum What {
    Config,
    Upstreams,
    Listeners,
    Health,
    /// The TLS certificates in use, per listener.
    Certs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Upstream,
    Listener,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ServerAction {
    Add,
    Remove,
    Drain,
    Undrain,
    Weight,
}

pub fn run(ctl: Ctl) -> anyhow::Result<()> {
    if let CtlCommand::Cluster { action } = &ctl.command {
        return cluster::run(action, ctl.config.as_deref(), ctl.output);
    }
    let client = Client::new(&ctl)?;
    match &ctl.command {
        CtlCommand::Get { what, name } => get(&client, *what, name.as_deref(), ctl.output),
        CtlCommand::Apply { file } => write_config(&client, file, false, ctl.output).map(drop),
        CtlCommand::Diff { file } => diff(&client, file, ctl.output),
        CtlCommand::Delete { kind, name } => {
            let path = match kind {
                Kind::Upstream => format!("/upstreams/{name}"),
                Kind::Listener => format!("/listeners/{name}"),
            };
            let reply = client.call("DELETE", &path, None, b"")?;
            print_written(&reply, ctl.output)
        }
        CtlCommand::Server {
            action,
            upstream,
            addr,
            weight,
        } => server(&client, *action, upstream, addr, *weight, ctl.output),
        CtlCommand::History => history(&client, ctl.output),
        CtlCommand::Cache { action } => cache::run(&client, action, ctl.output),
        CtlCommand::Cluster { .. } => unreachable!("handled above"),
    }
}

fn history(client: &Client, output: Output) -> anyhow::Result<()> {
    let reply = client.call("GET", "/history", None, b"")?;
    let header = ["VERSION", "AT", "BY", "CHANGES"];
    print_or_table(&reply, output, &header, |v| {
        let changes: Vec<String> = list(&v["changes"]).iter().map(text).collect();
        vec![
            text(&v["version"]),
            text(&v["at_utc"]),
            text(&v["by"]),
            if changes.is_empty() {
                "-".to_string()
            } else {
                changes.join(", ")
            },
        ]
    });
    Ok(())
}

/// `weir ctl diff`: exits 0 when applying the file would change nothing, 1 when it
/// would, 2 on trouble (as diff(1) does).
fn diff(client: &Client, file: &str, output: Output) -> anyhow::Result<()> {
    use std::io::Write;
    let code = match write_config(client, file, true, output) {
        Ok(reply) => {
            let same = list(&reply["changes"]).is_empty() && list(&reply["fields"]).is_empty();
            i32::from(!same)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}

struct Client {
    authority: String,
    token: Option<String>,
}

/// The default admin API URL.
const DEFAULT_ADMIN: &str = "http://127.0.0.1:9901";

/// The package's config: where its admin API and token are when nothing else says.
const INSTALLED_CONFIG: &str = "/etc/weir/weir.toml";

impl Client {
    /// Where the admin API is and its token: the options, else `WEIR_ADMIN` and
    /// `WEIR_ADMIN_TOKEN_FILE`, else `[admin]` of `--config`, else the default.
    fn new(ctl: &Ctl) -> anyhow::Result<Client> {
        let env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let installed = Path::new(INSTALLED_CONFIG);
        let implicit = ctl.config.is_none()
            && ctl.admin.is_none()
            && env("WEIR_ADMIN").is_none()
            && installed.exists();
        let config = ctl
            .config
            .clone()
            .or_else(|| implicit.then(|| installed.to_path_buf()));
        let admin_of_file = match &config {
            // The installed config, not named: one it cannot read leaves the defaults.
            Some(path) if implicit => weir_config::load_admin(path)
                .inspect_err(|e| eprintln!("warning: {INSTALLED_CONFIG} not used: {e:#}"))
                .ok(),
            Some(path) => Some(weir_config::load_admin(path)?),
            None => None,
        };
        let url = match (&ctl.admin, env("WEIR_ADMIN"), &admin_of_file) {
            (Some(url), _, _) => url.clone(),
            (None, Some(url), _) => url.to_string_lossy().into_owned(),
            (None, None, Some(admin)) => url_of(admin, config.as_deref())?,
            (None, None, None) => DEFAULT_ADMIN.to_string(),
        };
        let token_file = ctl
            .token_file
            .clone()
            .or_else(|| env("WEIR_ADMIN_TOKEN_FILE").map(PathBuf::from))
            .or_else(|| admin_of_file.and_then(|a| a.token_file));
        let token = match token_file {
            Some(path) => Some(
                std::fs::read_to_string(&path)
                    .with_context(|| match implicit {
                        true => format!(
                            "cannot read the token file {} ([admin] of {INSTALLED_CONFIG}): run \
                             as root or as a member of its group (sudo weir ctl ...), or give \
                             --admin",
                            path.display()
                        ),
                        false => format!("cannot read the token file {}", path.display()),
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(Client {
            authority: http::authority(&url)?,
            token,
        })
    }

    /// Calls `/api/v1{path}`; a non-2xx answer becomes an error with the API's fix.
    fn call(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> anyhow::Result<Value> {
        let headers: Vec<_> = content_type
            .map(|t| ("Content-Type", t))
            .into_iter()
            .collect();
        self.request(method, path, &headers, body)
    }

    /// Like `call` with any headers; a body that is not JSON comes back as a string.
    fn request(
        &self,
        method: &str,
        path: &str,
        extra: &[(&'static str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Value> {
        let mut headers: Vec<(&'static str, String)> =
            extra.iter().map(|(n, v)| (*n, v.to_string())).collect();
        if let Some(token) = &self.token {
            headers.push(("Authorization", format!("Bearer {token}")));
        }
        let path = format!("/api/v1{path}");
        let reply = http::send(
            &self.authority,
            &http::Request {
                method,
                path: &path,
                headers,
                body,
            },
        )?;
        let value: Value = serde_json::from_slice(&reply.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&reply.body).into_owned()));
        if !(200..300).contains(&reply.status) {
            bail!("{}", api_error(reply.status, &value));
        }
        Ok(value)
    }
}

/// The URL to reach an admin listener bound to `admin.bind` (a wildcard bind is reached
/// on the loopback address of its family).
fn url_of(
    admin: &weir_config::AdminSettings,
    file: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    let shown = file.map_or_else(String::new, |f| f.display().to_string());
    let Some(mut addr) = admin.bind else {
        bail!("{shown}: [admin] bind = \"off\": this config has no admin API to talk to");
    };
    if addr.ip().is_unspecified() {
        let loopback: std::net::IpAddr = match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        addr.set_ip(loopback);
    }
    Ok(format!("http://{addr}"))
}

fn api_error(status: u16, body: &Value) -> String {
    let message = body["error"].as_str().unwrap_or("request failed");
    let mut out = format!("{message} (HTTP {status})");
    if let Some(at) = body["at"].as_str() {
        out = format!("{at}: {out}");
    }
    if let Some(field) = body["field"].as_str().filter(|f| !f.is_empty()) {
        out.push_str(&format!("\n  field: {field}"));
    }
    if let Some(fix) = body["fix"].as_str().filter(|f| !f.is_empty()) {
        out.push_str(&format!("\n  fix: {fix}"));
    }
    out
}

fn get(client: &Client, what: What, name: Option<&str>, output: Output) -> anyhow::Result<()> {
    match what {
        What::Config if output == Output::Table => {
            // The file as it runs, comments and all.
            let accept = [("Accept", "application/toml")];
            out(&text(&client.request("GET", "/config", &accept, b"")?));
        }
        What::Config => print_json(&client.call("GET", "/config", None, b"")?),
        What::Upstreams => {
            let reply = client.call("GET", "/upstreams", None, b"")?;
            print_or_table(&reply, output, &["NAME", "LB", "SERVERS"], |u| {
                let servers: Vec<String> = list(&u["servers"]).iter().map(server_cell).collect();
                vec![text(&u["name"]), text(&u["lb"]), servers.join(", ")]
            });
        }
        What::Listeners => {
            let reply = client.call("GET", "/listeners", None, b"")?;
            print_or_table(
                &reply,
                output,
                &["NAME", "BIND", "ADDRESS", "ROUTES"],
                |l| {
                    let routes: Vec<String> = list(&l["routes"]).iter().map(text).collect();
                    vec![
                        text(&l["name"]),
                        text(&l["bind"]),
                        text(&l["addr"]),
                        routes.join(", "),
                    ]
                },
            );
        }
        What::Health => health(client, name, output)?,
        What::Certs => {
            let reply = client.call("GET", "/certs", None, b"")?;
            let header = [
                "LISTENER",
                "SOURCE",
                "NAMES",
                "ISSUER",
                "NOT AFTER",
                "DAYS LEFT",
                "RENEW AT",
                "LAST ERROR",
                "SHA-256",
            ];
            print_or_table(&reply, output, &header, |c| {
                let names: Vec<String> = list(&c["names"]).iter().map(text).collect();
                vec![
                    text(&c["listener"]),
                    text(&c["source"]),
                    names.join(", "),
                    text(&c["issuer"]),
                    text(&c["not_after"]),
                    text(&c["days_left"]),
                    text(&c["renew_at"]),
                    text(&c["last_error"]),
                    text(&c["sha256"]),
                ]
            });
        }
    }
    Ok(())
}

fn health(client: &Client, name: Option<&str>, output: Output) -> anyhow::Result<()> {
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => list(&client.call("GET", "/upstreams", None, b"")?["data"])
            .iter()
            .map(|u| text(&u["name"]))
            .collect(),
    };
    let mut all = Vec::new();
    for n in &names {
        all.push(client.call("GET", &format!("/upstreams/{n}/health"), None, b"")?["data"].clone());
    }
    if output == Output::Json {
        print_json(&json!(all));
        return Ok(());
    }
    let mut rows = Vec::new();
    for u in &all {
        for s in list(&u["servers"]) {
            let last = &s["last_check"];
            let reason = match &last["reason"] {
                Value::String(r) => r.clone(),
                _ if last.is_null() => "-".to_string(),
                _ => "ok".to_string(),
            };
            rows.push(vec![
                text(&u["upstream"]),
                text(&s["addr"]),
                text(&s["state"]),
                reason,
            ]);
        }
    }
    out(&table::render(
        &["UPSTREAM", "SERVER", "STATE", "LAST CHECK"],
        &rows,
    ));
    Ok(())
}

/// `apply` or `diff` (a dry run): prints what changes; returns the API's reply.
fn write_config(
    client: &Client,
    file: &str,
    dry_run: bool,
    output: Output,
) -> anyhow::Result<Value> {
    let body = read_bytes(file)?;
    let is_json =
        file.ends_with(".json") || body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let content_type = if is_json {
        "application/json"
    } else {
        "application/toml"
    };
    // Errors point into the file sent, not into the server's own config file; a JSON body
    // is checked as the TOML it converts to.
    let name = match (file, is_json) {
        ("-", false) => "stdin".to_string(),
        ("-", true) => "stdin (as TOML)".to_string(),
        (_, false) => file.to_string(),
        (_, true) => format!("{file} (as TOML)"),
    };
    let path = format!(
        "/config?dry_run={dry_run}&source={}",
        http::query_escape(&name)
    );
    let reply = client.call("PUT", &path, Some(content_type), &body)?;
    print_written(&reply, output)?;
    Ok(reply)
}

fn server(
    client: &Client,
    action: ServerAction,
    upstream: &str,
    addr: &str,
    weight: Option<u32>,
    output: Output,
) -> anyhow::Result<()> {
    let path = format!("/upstreams/{upstream}/servers/{addr}");
    let body = match (action, weight) {
        (ServerAction::Remove, _) => {
            return print_written(&client.call("DELETE", &path, None, b"")?, output)
        }
        (ServerAction::Drain, _) => json!({"drain": true}),
        (ServerAction::Undrain, _) => json!({"drain": false}),
        (ServerAction::Weight, None) => return Err(anyhow!("server weight needs a WEIGHT")),
        (_, Some(w)) => json!({"weight": w}),
        (ServerAction::Add, None) => json!({}),
    };
    // Only `add` may add a server: drain, undrain and weight of an address that is not in
    // the pool are a 404 (PATCH), so a typo cannot add one.
    let method = if action == ServerAction::Add {
        "PUT"
    } else {
        "PATCH"
    };
    let reply = client.call(
        method,
        &path,
        Some("application/json"),
        body.to_string().as_bytes(),
    )?;
    print_written(&reply, output)
}

fn print_written(reply: &Value, output: Output) -> anyhow::Result<()> {
    if output == Output::Json {
        print_json(reply);
        return Ok(());
    }
    let changes = list(&reply["changes"]);
    let verb = if reply["dry_run"] == true {
        "would change"
    } else {
        "changed"
    };
    if changes.is_empty() {
        println!("no changes (version {})", reply["version"]);
    } else {
        println!("{verb} (version {}):", reply["version"]);
        for c in changes {
            println!("  {}", text(&c));
        }
    }
    // A dry run also lists each key edited, old -> new as written.
    let fields = list(&reply["fields"]);
    if !fields.is_empty() {
        println!("fields:");
        for f in fields {
            let value = |v: &Value| v.as_str().unwrap_or("(unset)").to_string();
            println!(
                "  {}: {} -> {}",
                text(&f["path"]),
                value(&f["old"]),
                value(&f["new"])
            );
        }
    }
    Ok(())
}

fn print_or_table(
    reply: &Value,
    output: Output,
    header: &[&str],
    row: impl Fn(&Value) -> Vec<String>,
) {
    if output == Output::Json {
        return print_json(&reply["data"]);
    }
    let rows: Vec<Vec<String>> = list(&reply["data"]).iter().map(row).collect();
    out(&table::render(header, &rows));
}

/// FILE's bytes (`-`: stdin).
fn read_bytes(file: &str) -> anyhow::Result<Vec<u8>> {
    if file == "-" {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .context("reading stdin")?;
        return Ok(b);
    }
    std::fs::read(file).with_context(|| format!("cannot read {file}"))
}

/// FILE as UTF-8 text (`-`: stdin).
fn read_file(file: &str) -> anyhow::Result<String> {
    String::from_utf8(read_bytes(file)?).with_context(|| format!("{file} is not UTF-8"))
}

fn print_json(v: &Value) {
    out(&format!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_default()
    ));
}

/// Writes `text` to stdout through `generate::print`: a reader that went away
/// (`weir ctl get config | head -1`) ends the output quietly, where `print!` panics.
pub(crate) fn out(text: &str) {
    if let Err(e) = crate::generate::print(text.as_bytes()) {
        eprintln!("error: writing the output: {e:#}");
    }
}

fn list(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

fn server_cell(s: &Value) -> String {
    let mut cell = text(&s["addr"]);
    if s["weight"] != 1 {
        cell.push_str(&format!(" w={}", s["weight"]));
    }
    for flag in ["backup", "drain"] {
        if s[flag] == true {
            cell.push_str(&format!(" {flag}"));
        }
    }
    cell
}
