//! `weir ctl cluster push | pull | status`: a fleet's shared objects, straight in etcd
//! (weir_cluster::admin), reached through `[cluster] etcd` of the `-c FILE` given.

use std::path::Path;

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};
use weir_cluster::admin::Admin;
use weir_config::cluster::objects::Local;

use super::{print_json, print_or_table, print_written, text, Output};

#[derive(Subcommand)]
pub enum Action {
    /// Seed or replace the shared objects (listeners, routes, upstreams) with those of
    /// FILE; shows what changes, as `apply` does.
    Push {
        #[arg(short, long)]
        file: String,
        /// Validate and show the changes only.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the shared objects as one config file.
    Pull,
    /// The instances of the fleet and the revision each has applied.
    Status,
}

pub fn run(action: &Action, config: Option<&Path>, output: Output) -> anyhow::Result<()> {
    let Some(path) = config else {
        bail!("weir ctl cluster needs -c FILE: a config with [cluster] etcd = {{ ... }}");
    };
    let (config, local_text) = weir_config::load_file_with_text(path)?;
    let Some(etcd) = config.cluster.etcd else {
        bail!(
            "{}: no [cluster] etcd: this config is not of a fleet member",
            path.display()
        );
    };
    let admin = Admin::new(etcd)?;
    match action {
        Action::Push { file, dry_run } => push(&admin, path, &local_text, file, *dry_run, output),
        Action::Pull => {
            super::out(&admin.pull()?);
            Ok(())
        }
        Action::Status => status(&admin, output),
    }
}

fn push(
    admin: &Admin,
    path: &Path,
    local_text: &str,
    file: &str,
    dry_run: bool,
    output: Output,
) -> anyhow::Result<()> {
    let pushed = super::read_file(file)?;
    let file_name = path.display().to_string();
    let base = weir_config::config_dir(path);
    let local = Local {
        text: local_text,
        file: &file_name,
        base: Some(&base),
    };
    let plan = admin.plan(&local, &pushed, file)?;
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
    let version = match dry_run || plan.writes.is_empty() {
        true => 0,
        false => admin.push(&plan).context("push")?,
    };
    let keys: Vec<Value> = plan
        .writes
        .iter()
        .map(|(k, v)| json!({"key": k, "delete": v.is_none()}))
        .collect();
    let changes: Vec<String> = plan.changes.iter().map(ToString::to_string).collect();
    let reply = json!({"version": version, "dry_run": dry_run, "changes": changes, "keys": keys});
    print_written(&reply, output)?;
    if output == Output::Table && !keys.is_empty() {
        println!("keys {}:", if dry_run { "to write" } else { "written" });
        for k in &keys {
            let verb = if k["delete"] == true { "delete" } else { "put" };
            println!("  {verb} {}", text(&k["key"]));
        }
    }
    Ok(())
}

fn status(admin: &Admin, output: Output) -> anyhow::Result<()> {
    let reply = admin.status()?;
    if output == Output::Json {
        print_json(&reply);
        return Ok(());
    }
    println!("config revision {}", reply["revision"]);
    let table = json!({"data": reply["instances"]});
    let header = ["NODE", "APPLIED", "SEEN", "REJECTED"];
    print_or_table(&table, output, &header, |i| {
        vec![
            text(&i["node"]),
            text(&i["applied"]),
            text(&i["seen"]),
            i["rejected"].as_str().unwrap_or("-").to_string(),
        ]
    });
    Ok(())
}
