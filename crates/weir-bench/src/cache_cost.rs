//! `weir-bench cache-cost` (issue 27): CPU per cache hit of Weir (a route with `cache`, a
//! memory store), nginx (`proxy_cache`, its files in the page cache) and Varnish (`-s
//! malloc`), each on the proxy CPU in front of an nginx backend whose answers say
//! `Cache-Control: public, max-age=3600`: 615 bytes at `/`, and a 1 MiB file at `/1m`; wrk
//! asks for one URL at a time, so every request after the first is a hit. Each peer is
//! checked to answer from its cache first. Weir runs against each peer alternately, as in
//! `policy-cost`; the quoted ratios are medians of the paired ratios.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::backend::body_615;
use crate::policy_cost::{alternate, print_pair, probe_head, start_weir, weir_binary, Args, Proxy};
use crate::process::{self, Child, Spec};
use crate::{configs, peers, LOAD_CPU, PROXY_CPU};

pub fn main(a: Args, dir: &Path) -> Result<()> {
    let weir = weir_binary(&a)?;
    let nginx = process::find_program("nginx").context("nginx is not installed")?;
    let (_backend, backend) = cacheable_backend(&nginx, dir)?;
    let weir = start_weir(
        &weir,
        dir,
        "cache",
        backend,
        "cache = { store = \"bench\", status_header = true }",
        "[caches.bench]\nkind = \"memory\"\nmax_size = \"64MiB\"\n",
    )?;
    let mut others = vec![start_nginx_cache(&nginx, dir, backend)?];
    match process::find_program("varnishd") {
        Some(varnishd) => others.push(start_varnish(&varnishd, dir, backend)?),
        None => {
            eprintln!("weir-bench: varnishd is not installed (bench/setup.sh): Weir vs nginx only")
        }
    }
    for (path, size) in [("/", "615 B"), (BIG, "1 MiB")] {
        for p in std::iter::once(&weir).chain(&others) {
            probe_head(p.addr, path, "identity")?;
            let head = probe_head(p.addr, path, "identity")?;
            if !is_hit(&head) {
                bail!(
                    "{}: the second request for {path} was not a cache hit:\n{head}",
                    p.label
                );
            }
        }
        println!(
            "## cache-cost: CPU per cache hit, {size} cacheable answer, wrk -c{} ({} s x {} pairs)\n",
            a.conns, a.duration, a.repeat
        );
        for other in &others {
            let (ra, rb) = alternate(other, &weir, &a, dir, &[], path)?;
            print_pair(&other.label, &weir.label, &ra, &rb, a.duration);
        }
    }
    Ok(())
}

/// The path of the 1 MiB object.
const BIG: &str = "/1m";

/// Whether a lower-cased response head says it came from the cache: Weir's
/// `Cache-Status`, nginx's `$upstream_cache_status` (added as `X-Cache-Status`), or
/// Varnish's `X-Varnish` with two ids (this request's and the one that stored the object).
fn is_hit(head: &str) -> bool {
    head.lines().any(|l| {
        l == "cache-status: weir; hit"
            || l == "x-cache-status: hit"
            || l.strip_prefix("x-varnish: ")
                .is_some_and(|ids| ids.contains(' '))
    })
}

/// nginx on the load CPU answering 200 with 615 bytes, and with a 1 MiB file at [`BIG`],
/// both cacheable for an hour.
fn cacheable_backend(nginx: &Path, dir: &Path) -> Result<(Child, SocketAddr)> {
    let port = process::free_port()?;
    let files = dir.join("cacheable-files");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join(&BIG[1..]), vec![b'x'; 1 << 20])?;
    let locations = format!(
        "        location / {{\n            add_header Cache-Control \"public, max-age=3600\" always;\n            return 200 \"{}\";\n        }}\n\
         \x20       location = {BIG} {{\n            root {};\n            add_header Cache-Control \"public, max-age=3600\" always;\n        }}",
        body_615(),
        files.display()
    );
    let conf = configs::nginx_conf("cacheable-backend", dir, port, "", &locations, None)?;
    let mut child = peers::start_nginx(nginx, "cacheable-backend", LOAD_CPU, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok((child, addr))
}

/// nginx with `proxy_cache` (keys zone 10 MiB, 64 MiB of entries) and kept upstream
/// connections, as the `nginx` peer proxies.
fn start_nginx_cache(nginx: &Path, dir: &Path, backend: SocketAddr) -> Result<Proxy> {
    let port = process::free_port()?;
    let upstream = format!(
        "    proxy_cache_path {}/nginx-cache levels=1:2 keys_zone=bench:10m max_size=64m inactive=60m use_temp_path=off;\n\
         \x20   upstream backend {{\n        server {backend};\n        keepalive 128;\n        keepalive_requests 1000000;\n        keepalive_timeout 300s;\n    }}\n",
        dir.display()
    );
    let locations = "        location / {\n            proxy_pass http://backend;\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            proxy_cache bench;\n            add_header X-Cache-Status $upstream_cache_status;\n        }\n";
    let conf = configs::nginx_conf("nginx-cache", dir, port, &upstream, locations, None)?;
    let mut child = peers::start_nginx(nginx, "nginx-cache", PROXY_CPU, dir, &conf)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(10))?;
    Ok(Proxy {
        label: "nginx proxy_cache".into(),
        child,
        addr,
    })
}

/// Varnish with its built-in VCL for `backend`, 64 MiB of malloc storage, its threads on
/// the proxy CPU.
fn start_varnish(varnishd: &Path, dir: &Path, backend: SocketAddr) -> Result<Proxy> {
    let port = process::free_port()?;
    let workdir = dir.join("varnish");
    std::fs::create_dir_all(&workdir)?;
    let spec = Spec::new(
        "varnish",
        varnishd,
        Some(PROXY_CPU),
        dir.join("varnish.log"),
    )
    .args([
        "-F".to_string(),
        "-a".into(),
        format!("127.0.0.1:{port}"),
        "-b".into(),
        backend.to_string(),
        "-s".into(),
        "malloc,64m".into(),
        "-n".into(),
        workdir.to_string_lossy().into_owned(),
    ]);
    let mut child = process::spawn(&spec)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    process::wait_listening(addr, &mut child, Duration::from_secs(20))?;
    Ok(Proxy {
        label: "varnish -s malloc".into(),
        child,
        addr,
    })
}
