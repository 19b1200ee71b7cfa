//! `weir ctl cache`: the HTTP cache's stores (`stats`) and purging entries (`purge URL`,
//! or every key under a prefix with `purge PREFIX*`), through the admin API's `/caches`.

use clap::Subcommand;
use serde_json::json;

use super::{print_json, print_or_table, text, Client, Output};

#[derive(Subcommand)]
pub enum Action {
    /// Each store's size and counts (hits, misses, revalidations, ...).
    Stats,
    /// Remove the entry of URL (`http://host/path?query`, the default key), or every
    /// entry whose key starts with PREFIX when it ends in `*`.
    Purge {
        url: String,
        /// Only this [caches.NAME] store (default: every store).
        #[arg(long)]
        store: Option<String>,
    },
}

pub fn run(client: &Client, action: &Action, output: Output) -> anyhow::Result<()> {
    match action {
        Action::Stats => {
            let reply = client.call("GET", "/caches", None, b"")?;
            let header = [
                "STORE",
                "ENTRIES",
                "BYTES",
                "MAX",
                "HITS",
                "MISSES",
                "STALE",
                "EVICTIONS",
            ];
            print_or_table(&reply, output, &header, |s| {
                [
                    "name",
                    "entries",
                    "bytes",
                    "max_size",
                    "hits",
                    "misses",
                    "stale",
                    "evictions",
                ]
                .iter()
                .map(|k| text(&s[*k]))
                .collect()
            });
        }
        Action::Purge { url, store } => {
            let mut body = match url.strip_suffix('*') {
                Some(prefix) => json!({ "prefix": prefix }),
                None => json!({ "url": url }),
            };
            if let Some(store) = store {
                body["store"] = json!(store);
            }
            let body = body.to_string();
            let reply = client.call(
                "POST",
                "/caches/purge",
                Some("application/json"),
                body.as_bytes(),
            )?;
            match output {
                Output::Json => print_json(&reply["data"]),
                Output::Table => println!("purged {} entries", text(&reply["data"]["purged"])),
            }
        }
    }
    Ok(())
}
