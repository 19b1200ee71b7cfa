//! Object edits on the config document (`toml_edit`), so a change through the API touches
//! only the object it names and the file keeps its comments and layout elsewhere. The
//! edited text is then validated like the file (see `store`).

use toml_edit::{ArrayOfTables, DocumentMut, InlineTable, Item, Table, Value};

use super::error::ApiError;

/// `PUT /upstreams/{name}`: the upstream's table becomes `body`.
pub fn put_upstream(doc: &mut DocumentMut, name: &str, body: Table) -> Result<(), ApiError> {
    let upstreams = doc
        .entry("upstreams")
        .or_insert_with(|| Item::Table(implicit_table()))
        .as_table_like_mut()
        .ok_or_else(|| {
            ApiError::bad_request(
                "upstreams is not a table",
                "write upstreams as [upstreams.NAME] tables",
            )
            .field("upstreams")
        })?;
    upstreams.insert(name, Item::Table(body));
    Ok(())
}

pub fn delete_upstream(doc: &mut DocumentMut, name: &str) -> Result<(), ApiError> {
    doc.get_mut("upstreams")
        .and_then(Item::as_table_like_mut)
        .and_then(|t| t.remove(name))
        .map(drop)
        .ok_or_else(|| no_upstream(name))
}

/// Whether a server edit may add the server.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ServerEdit {
    /// `PUT`: adds the server, or changes it.
    AddOrChange,
    /// `PATCH` (`weir ctl server drain|undrain|weight`): changes an existing server; an
    /// address that is not in the pool is a 404, so a typo does not add a server.
    ChangeOnly,
}

/// `PUT|PATCH /upstreams/{name}/servers/{addr}`: adds the server (PUT only), or merges
/// `settings` (weight, drain, backup, max_connections) into it. `drain = false` removes
/// the key.
pub fn put_server(
    doc: &mut DocumentMut,
    upstream: &str,
    addr: &str,
    settings: &Table,
    how: ServerEdit,
) -> Result<(), ApiError> {
    let servers = servers_mut(doc, upstream)?;
    let index = servers.iter().position(|s| server_addr(s) == Some(addr));
    let mut entry = match index {
        Some(i) => servers
            .get(i)
            .and_then(Value::as_inline_table)
            .cloned()
            .unwrap_or_default(),
        None if how == ServerEdit::ChangeOnly => return Err(no_server(upstream, addr)),
        None => {
            let mut t = InlineTable::new();
            t.insert("addr", Value::from(addr));
            t
        }
    };
    for (key, item) in settings.iter() {
        if key == "addr" {
            continue;
        }
        match item.as_value() {
            Some(v) if key == "drain" && v.as_bool() == Some(false) => {
                entry.remove(key);
            }
            Some(v) => {
                entry.insert(key, v.clone());
            }
            None => {
                return Err(ApiError::bad_request(
                    format!("server setting {key} is not a plain value"),
                    "send settings such as {\"weight\": 3} or {\"drain\": true}",
                )
                .field(key))
            }
        }
    }
    // The space before the closing brace of `{ addr = "..." }` belongs to the last value:
    // a key added after it would be written `"..." , drain = true`. Normal spacing.
    entry.fmt();
    match index {
        Some(i) => servers.replace(i, entry),
        None => {
            servers.push(entry);
            return Ok(());
        }
    };
    Ok(())
}

pub fn delete_server(doc: &mut DocumentMut, upstream: &str, addr: &str) -> Result<(), ApiError> {
    let servers = servers_mut(doc, upstream)?;
    let index = servers
        .iter()
        .position(|s| server_addr(s) == Some(addr))
        .ok_or_else(|| no_server(upstream, addr))?;
    servers.remove(index);
    Ok(())
}

fn no_server(upstream: &str, addr: &str) -> ApiError {
    ApiError::not_found(
        &format!("server {addr} of upstream {upstream}"),
        &format!(
            "`weir ctl get upstreams` (GET /api/v1/upstreams/{upstream}) lists its servers; \
             `weir ctl server add {upstream} {addr}` adds one"
        ),
    )
}

/// `PUT /listeners/{name}`: replaces the listener's settings; its routes stay unless the
/// body brings its own.
pub fn put_listener(doc: &mut DocumentMut, name: &str, mut body: Table) -> Result<(), ApiError> {
    body.insert("name", toml_edit::value(name));
    let listeners = listeners_mut(doc)?;
    let index = listeners.iter().position(|l| table_name(l) == Some(name));
    match index.and_then(|i| listeners.get_mut(i)) {
        Some(existing) => {
            if !body.contains_key("routes") {
                if let Some(routes) = existing.remove("routes") {
                    body.insert("routes", routes);
                }
            }
            *existing = body;
        }
        None => listeners.push(body),
    }
    Ok(())
}

pub fn delete_listener(doc: &mut DocumentMut, name: &str) -> Result<(), ApiError> {
    let listeners = listeners_mut(doc)?;
    let index = listeners
        .iter()
        .position(|l| table_name(l) == Some(name))
        .ok_or_else(|| no_listener(name))?;
    listeners.remove(index);
    Ok(())
}

/// `PUT /listeners/{name}/routes/{route}`: replaces or appends the route.
pub fn put_route(
    doc: &mut DocumentMut,
    listener: &str,
    route: &str,
    mut body: Table,
) -> Result<(), ApiError> {
    body.insert("name", toml_edit::value(route));
    let routes = routes_mut(doc, listener)?;
    let index = routes.iter().position(|r| table_name(r) == Some(route));
    match index.and_then(|i| routes.get_mut(i)) {
        Some(existing) => *existing = body,
        None => routes.push(body),
    }
    Ok(())
}

pub fn delete_route(doc: &mut DocumentMut, listener: &str, route: &str) -> Result<(), ApiError> {
    let routes = routes_mut(doc, listener)?;
    let index = routes
        .iter()
        .position(|r| table_name(r) == Some(route))
        .ok_or_else(|| {
            ApiError::not_found(
                &format!("route {route} of listener {listener}"),
                "GET /api/v1/listeners/{name} lists its routes",
            )
        })?;
    routes.remove(index);
    Ok(())
}

fn implicit_table() -> Table {
    let mut t = Table::new();
    t.set_implicit(true);
    t
}

fn table_name(t: &Table) -> Option<&str> {
    t.get("name")?.as_str()
}

fn server_addr(v: &Value) -> Option<&str> {
    v.as_inline_table()?.get("addr")?.as_str()
}

fn servers_mut<'a>(
    doc: &'a mut DocumentMut,
    upstream: &str,
) -> Result<&'a mut toml_edit::Array, ApiError> {
    let table = doc
        .get_mut("upstreams")
        .and_then(Item::as_table_like_mut)
        .and_then(|t| t.get_mut(upstream))
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| no_upstream(upstream))?;
    let servers = table
        .entry("servers")
        .or_insert(toml_edit::value(toml_edit::Array::new()));
    servers.as_array_mut().ok_or_else(|| {
        ApiError::bad_request(
            format!("upstreams.{upstream}.servers is not an inline array"),
            "write servers = [{ addr = \"host:port\" }, ...] in the config file",
        )
        .field(format!("upstreams.{upstream}.servers"))
    })
}

fn listeners_mut(doc: &mut DocumentMut) -> Result<&mut ArrayOfTables, ApiError> {
    doc.entry("listeners")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| {
            ApiError::bad_request(
                "listeners is not an array of tables",
                "write each listener as a [[listeners]] table",
            )
            .field("listeners")
        })
}

fn routes_mut<'a>(
    doc: &'a mut DocumentMut,
    listener: &str,
) -> Result<&'a mut ArrayOfTables, ApiError> {
    let l = listeners_mut(doc)?
        .iter_mut()
        .find(|l| table_name(l) == Some(listener))
        .ok_or_else(|| no_listener(listener))?;
    let item = l
        .entry("routes")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
    item.as_array_of_tables_mut().ok_or_else(|| {
        ApiError::bad_request(
            format!("the routes of listener {listener} are not an array of tables"),
            "write each route as a [[listeners.routes]] table",
        )
    })
}

fn no_upstream(name: &str) -> ApiError {
    ApiError::not_found(
        &format!("upstream {name}"),
        "GET /api/v1/upstreams lists the upstreams",
    )
}

fn no_listener(name: &str) -> ApiError {
    ApiError::not_found(
        &format!("listener {name}"),
        "GET /api/v1/listeners lists the listeners",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# the edge
[[listeners]]
name = "web" # public
bind = "127.0.0.1:0"

[[listeners.routes]]
name = "all"
upstream = "app"

# app servers
[upstreams.app]
servers = [{ addr = "127.0.0.1:9001" }] # two soon
"#;

    fn doc() -> DocumentMut {
        FILE.parse().unwrap()
    }

    #[test]
    fn server_edits_keep_comments() {
        let mut d = doc();
        let mut weight = Table::new();
        weight.insert("drain", toml_edit::value(true));
        let add = ServerEdit::AddOrChange;
        // A typo in drain must not add a server (issue 30 item 2).
        let e = put_server(
            &mut d,
            "app",
            "127.0.0.1:9999",
            &weight,
            ServerEdit::ChangeOnly,
        )
        .unwrap_err();
        assert_eq!(e.status, hyper::StatusCode::NOT_FOUND, "{e:?}");
        put_server(&mut d, "app", "127.0.0.1:9002", &Table::new(), add).unwrap();
        put_server(
            &mut d,
            "app",
            "127.0.0.1:9001",
            &weight,
            ServerEdit::ChangeOnly,
        )
        .unwrap();
        let text = d.to_string();
        assert!(
            text.contains("# the edge") && text.contains("# app servers"),
            "{text}"
        );
        // Was: `{ addr = "127.0.0.1:9001" , drain = true }`.
        assert!(
            text.contains(r#"{ addr = "127.0.0.1:9001", drain = true }"#),
            "{text}"
        );
        let config = weir_config::parse_str(&text, "t").unwrap();
        let servers = &config.upstreams[0].servers;
        assert_eq!(servers.len(), 2);
        assert!(servers[0].drain && !servers[1].drain);
        delete_server(&mut d, "app", "127.0.0.1:9001").unwrap();
        assert!(delete_server(&mut d, "app", "127.0.0.1:9001").is_err());
        assert!(put_server(&mut d, "nope", "127.0.0.1:1", &Table::new(), add).is_err());
    }

    #[test]
    fn listener_and_route_edits() {
        let mut d = doc();
        let mut route: Table = Table::new();
        route.insert("upstream", toml_edit::value("app"));
        route.insert("path_prefix", toml_edit::value("/api"));
        put_route(&mut d, "web", "api", route).unwrap();
        let mut listener = Table::new();
        listener.insert("bind", toml_edit::value("127.0.0.1:0"));
        put_listener(&mut d, "web", listener.clone()).unwrap();
        put_listener(&mut d, "admin2", listener).unwrap();
        let config = weir_config::parse_str(&d.to_string(), "t").unwrap();
        assert_eq!(config.listeners.len(), 2);
        assert_eq!(config.listeners[0].routes.len(), 2);
        delete_route(&mut d, "web", "all").unwrap();
        delete_listener(&mut d, "admin2").unwrap();
        assert!(delete_listener(&mut d, "admin2").is_err());
        delete_upstream(&mut d, "app").unwrap();
        assert!(delete_upstream(&mut d, "app").is_err());
    }
}
