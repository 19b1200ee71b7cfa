//! `weir demo`: three echo backends on loopback and Weir in front of them, round robin.
//! The config is generated as TOML and goes through the same parser as a user's file.

use weir_testkit::Backend;

use crate::run::Running;

pub fn run(port: u16, admin_port: u16) -> anyhow::Result<()> {
    let signals = crate::run::Signals::install()?;
    let backends: Vec<Backend> = (1..=3)
        .map(|i| Backend::echo(&format!("echo-{i}")))
        .collect();
    let servers: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ addr = \"{}\" }}", b.addr()))
        .collect();
    let toml = demo_config(port, admin_port, &servers.join(", "));
    let config = weir_config::parse_str(&toml, "demo.toml")?;
    let running = Running::start(config, None, toml.clone())?;
    let proxy = running
        .proxy
        .listener_addr("demo")
        .map_or_else(String::new, |a| a.to_string());
    let admin = running
        .admin
        .as_ref()
        .map_or_else(String::new, |a| a.addr().to_string());
    println!("Weir demo: three echo backends, round robin, Weir in front.\n");
    println!("  proxy    http://{proxy}/            try: curl -i http://{proxy}/hello");
    println!("  rewrite  http://{proxy}/cgi/x       (ProxyPass: the backend sees /x)");
    println!("  admin    http://{admin}/live  http://{admin}/ready");
    println!("  metrics  http://{admin}/metrics\n");
    println!("The config this demo runs (save it and use `weir run -c FILE`):\n\n{toml}");
    println!("Ctrl-C stops it.");
    let result = running.wait_for_signal_and_stop(signals);
    drop(backends);
    result
}

fn demo_config(port: u16, admin_port: u16, servers: &str) -> String {
    format!(
        r#"[server]
workers = "auto"

[admin]
bind = "127.0.0.1:{admin_port}"

[[listeners]]
name = "demo"
bind = "127.0.0.1:{port}"

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
