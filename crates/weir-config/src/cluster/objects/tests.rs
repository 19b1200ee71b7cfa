use super::*;

const FILE: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"
[listeners.http2]
max_concurrent_streams = 50

[[listeners.routes]]
name = "b-all"
upstream = "app"

[[listeners.routes]]
name = "a-api"
path_prefix = "/api"
upstream = "app"

[upstreams.app]
servers = [{ addr = "127.0.0.1:9001" }]
"#;

const LOCAL: &str = "[server]\nworkers = 1\n[cluster]\nnode = \"n1\"\netcd = { endpoints = [\"http://127.0.0.1:2379\"], prefix = \"/weir/t\" }\n";

fn key_name(key: &str) -> String {
    format!("/weir/t/config/{key}")
}

fn local() -> Local<'static> {
    Local {
        text: LOCAL,
        file: "local.toml",
        base: None,
    }
}

fn build(objects: &Objects) -> Result<Config, ConfigError> {
    let assembled = assemble(LOCAL, objects, &key_name)?;
    parse(&local(), &assembled, objects, &key_name)
}

#[test]
fn split_then_assemble_gives_the_same_config_routes_in_name_order() {
    let objects = split(FILE, "f.toml").unwrap();
    let keys: Vec<&str> = objects.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "listeners/web",
            "routes/web/a-api",
            "routes/web/b-all",
            "upstreams/app"
        ]
    );
    assert!(objects["listeners/web"].contains("[http2]"), "{objects:?}");
    assert!(!objects["listeners/web"].contains("name"), "{objects:?}");
    let config = build(&objects).unwrap();
    let file = crate::parse_str(FILE, "f.toml").unwrap();
    assert_eq!(config.listeners[0].http2, file.listeners[0].http2);
    let names: Vec<&str> = config.listeners[0]
        .routes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["a-api", "b-all"]);
    assert_eq!(config.upstreams, file.upstreams);
    assert_eq!(config.cluster.etcd.as_ref().unwrap().node, "n1");
    // The round trip says the same: nothing would be written.
    let again = split(&assemble(LOCAL, &objects, &key_name).unwrap().text, "x").unwrap();
    for (k, v) in &objects {
        assert!(same_value(v, &again[k]), "{k}: {v:?} vs {:?}", again[k]);
    }
    assert_eq!(route_order_notes(FILE).len(), 1);
}

#[test]
fn an_error_in_an_object_is_told_at_its_key() {
    let mut objects = split(FILE, "f.toml").unwrap();
    objects.insert(
        "routes/web/c-bad".into(),
        "path_prefix = \"/c\"\n\nupstream = \"nope\"\n".into(),
    );
    let e = build(&objects).unwrap_err();
    assert_eq!(e.file, "/weir/t/config/routes/web/c-bad", "{e}");
    assert_eq!(
        (e.line, e.column, e.field.as_str()),
        (3, 1, "upstream"),
        "{e}"
    );
    assert!(e.message.contains("nope"), "{e}");

    let mut objects = split(FILE, "f.toml").unwrap();
    objects.insert(
        "upstreams/app".into(),
        "servers = [{ addr = \"127.0.0.1:1\" }]\nwieght = 2\n".into(),
    );
    let e = build(&objects).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line),
        ("/weir/t/config/upstreams/app", 2),
        "{e}"
    );
    assert!(e.message.starts_with("unknown field"), "{e}");

    objects.insert(
        "upstreams/app".into(),
        "servers = [{ addr = \"127.0.0.1:1\" }\n".into(),
    );
    let e = build(&objects).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line),
        ("/weir/t/config/upstreams/app", 2),
        "{e}"
    );
    assert!(e.message.contains("expected `]`"), "{e}");

    objects.insert("upstreams/app".into(), "name = \"other\"\n".into());
    let e = build(&objects).unwrap_err();
    assert!(e.message.contains("differs"), "{e}");
}

#[test]
fn a_route_without_its_listener_and_an_empty_fleet() {
    let mut objects = Objects::new();
    assert!(build(&objects).unwrap().listeners.is_empty());
    objects.insert("routes/web/a".into(), "upstream = \"app\"\n".into());
    let e = build(&objects).unwrap_err();
    assert_eq!(e.file, "/weir/t/config/routes/web/a", "{e}");
}

#[test]
fn a_node_binds_a_shared_listener_at_its_own_address() {
    let local = format!("{LOCAL}binds = {{ web = \"127.0.0.1:0\" }}\n");
    let mut objects = split(FILE, "f.toml").unwrap();
    objects.insert("listeners/web".into(), "bind = \"10.0.0.1:80\"\n".into());
    let assembled = assemble(&local, &objects, &key_name).unwrap();
    let l = Local {
        text: &local,
        file: "local.toml",
        base: None,
    };
    let config = parse(&l, &assembled, &objects, &key_name).unwrap();
    assert_eq!(
        config.listeners[0].binds[0].addr,
        "127.0.0.1:0".parse().unwrap()
    );
    // The shared value stays as it is in etcd.
    assert!(assembled.text.contains("10.0.0.1:80"));
}

#[test]
fn the_local_file_of_a_member_holds_no_shared_objects() {
    let e = crate::cluster::check_local_file(&format!("{LOCAL}{FILE}"), "local.toml").unwrap_err();
    assert_eq!(e.field, "listeners", "{e}");
    assert!(crate::cluster::check_local_file(LOCAL, "local.toml").is_ok());
    let e = crate::parse_str("[cluster]\nnode = \"a\"\n", "l").unwrap_err();
    assert_eq!(e.field, "cluster.node", "{e}");
    let e = crate::parse_str(
        "[cluster]\netcd = { endpoints = [\"10.0.0.1:2379\"], prefix = \"/w\" }\nnode = \"a\"\n",
        "l",
    )
    .unwrap_err();
    assert_eq!(e.field, "cluster.etcd.endpoints[0]", "{e}");
}

/// The objects of `FILE` with a listener TLS-less sub-table, a second listener and an
/// upstream with a sub-table: enough shapes for the cached path to go wrong on.
fn varied() -> Objects {
    let mut objects = split(FILE, "f.toml").unwrap();
    objects.insert(
        "listeners/admin2".into(),
        "bind = \"127.0.0.1:0\"\n[default_response]\nstatus = 403\n".into(),
    );
    objects.insert(
        "routes/admin2/all".into(),
        "respond = { status = 200, body = \"ok\" }\n".into(),
    );
    objects.insert(
        "upstreams/other".into(),
        "lb = \"weighted_round_robin\"\n[[servers]]\naddr = \"127.0.0.1:9002\"\nweight = 2\n"
            .into(),
    );
    objects
}

fn cached(parsed: &mut Parsed, objects: &Objects) -> Result<Config, ConfigError> {
    parsed.config(&local(), objects, &key_name)
}

#[test]
fn parsed_objects_give_the_files_config_and_parse_only_what_changed() {
    let mut objects = varied();
    let mut parsed = Parsed::default();
    assert_eq!(
        cached(&mut parsed, &objects).unwrap(),
        build(&objects).unwrap()
    );
    assert_eq!(parsed.parses, 7);
    objects.insert(
        "routes/web/a-api".into(),
        "path_prefix = \"/v2\"\nupstream = \"other\"\n".into(),
    );
    objects.remove("routes/admin2/all");
    let config = cached(&mut parsed, &objects).unwrap();
    assert_eq!(config, build(&objects).unwrap());
    assert_eq!(parsed.parses, 8, "one value changed, one parsed");
    assert_eq!(config.listeners[1].routes[0].path_prefix, "/v2");
    // The same objects again: nothing parsed.
    cached(&mut parsed, &objects).unwrap();
    assert_eq!(parsed.parses, 8);
    // An upstream sorting first moves every route's upstream index: routes taken as
    // validated before would point at the wrong pool.
    objects.insert(
        "upstreams/aaa".into(),
        "servers = [{ addr = \"127.0.0.1:9003\" }]\n".into(),
    );
    let config = cached(&mut parsed, &objects).unwrap();
    assert_eq!(config, build(&objects).unwrap());
    assert_eq!(config.upstreams[0].name, "aaa");
}

#[test]
fn a_bad_object_is_told_as_the_file_path_tells_it_and_nothing_sticks() {
    let good = varied();
    let mut parsed = Parsed::default();
    cached(&mut parsed, &good).unwrap();
    let bad_values = [
        (
            "routes/web/a-api",
            "path_prefix = \"/api\"\nupstream = \"nope\"\n",
        ),
        ("routes/web/a-api", "upstream = \"app\"\nbogus = 1\n"),
        ("routes/web/a-api", "name = \"other\"\nupstream = \"app\"\n"),
        ("routes/gone/x", "upstream = \"app\"\n"),
        ("listeners/web", "bind = \"127.0.0.1:0\"\nbacklog = 0\n"),
        ("upstreams/app", "servers = \"x\"\n"),
        ("upstreams/app", "servers = [\n"),
    ];
    for (key, value) in bad_values {
        let mut objects = good.clone();
        objects.insert(key.into(), value.into());
        let want = build(&objects).unwrap_err().to_string();
        let got = cached(&mut parsed, &objects).unwrap_err().to_string();
        assert_eq!(got, want, "{key} = {value:?}");
        assert!(
            got.contains(&key_name(key)) || got.contains("does not exist"),
            "{got}"
        );
        assert_eq!(cached(&mut parsed, &good).unwrap(), build(&good).unwrap());
    }
}

#[test]
fn an_objects_edits_are_named_as_in_the_assembled_file() {
    let changes = field_changes(
        "routes/web/api",
        Some("path_prefix = \"/api\"\nrespond = { status = 200, body = \"a\" }\n"),
        Some("path_prefix = \"/api\"\nrespond = { status = 200, body = \"b\" }\n"),
    );
    let shown: Vec<String> = changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        ["listeners[web].routes[api].respond.body: \"a\" -> \"b\""]
    );
    let added = field_changes("upstreams/u", None, Some("lb = \"random\"\n"));
    assert_eq!(added[0].path, "upstreams.u");
    assert_eq!(added[0].old, None);
    let removed = field_changes("listeners/w", Some("bind = \"127.0.0.1:1\"\n"), None);
    assert!(
        removed[0].old.as_deref().unwrap().contains("name = \"w\""),
        "{removed:?}"
    );
}

/// A well-formed bcrypt entry's hash (the password does not matter here).
const HASH: &str = "$2y$04$7q1Qb9LJ3rXzHqgW6w5Heu2mIOEbDRt9nN6x3r4bC8QY0bqW6dD7K";

#[test]
fn routes_whose_validation_reads_files_are_validated_each_time() {
    let dir = std::env::temp_dir().join(format!("weir-parsed-files-{}", std::process::id()));
    let (root, users) = (dir.join("site"), dir.join("htpasswd"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&users, format!("alice:{HASH}\nbob:{HASH}\n")).unwrap();
    let mut objects = varied();
    objects.insert(
        "routes/web/c-auth".into(),
        format!(
            "path_prefix = \"/auth\"\nupstream = \"app\"\nbasic_auth = {{ users_file = \"{}\" }}\n",
            users.display()
        ),
    );
    objects.insert(
        "routes/web/d-site".into(),
        format!(
            "path_prefix = \"/site\"\nfiles = {{ root = \"{}\" }}\n",
            root.display()
        ),
    );
    let mut parsed = Parsed::default();
    cached(&mut parsed, &objects).unwrap();
    // Bob leaves the users file: the same objects again give the file's users, not the
    // ones read the first time.
    std::fs::write(&users, format!("alice:{HASH}\n")).unwrap();
    let config = cached(&mut parsed, &objects).unwrap();
    assert_eq!(config, build(&objects).unwrap());
    let mut routes = config.listeners.iter().flat_map(|l| &l.routes);
    let auth = routes.find(|r| r.name == "c-auth").unwrap();
    let names: Vec<&str> = auth
        .filters
        .basic_auth
        .as_ref()
        .unwrap()
        .users
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(names, ["alice"]);
    // The root is gone: rejected as `weir check` rejects it.
    std::fs::remove_dir_all(&root).unwrap();
    let want = build(&objects).unwrap_err().to_string();
    assert_eq!(cached(&mut parsed, &objects).unwrap_err().to_string(), want);
    std::fs::remove_dir_all(&dir).unwrap();
}
