//! The dashboard in a real browser (headless Chromium through chromedriver, see
//! `support_browser`) against the real binary with traffic flowing: route names and a
//! request count that rises, certificates, a stale page's Drain refused by the ETag check,
//! Undrain by mouse and Drain by keyboard flipping a server's state (and the config file and
//! the API saying so), the history's diff of that change, no page-wide scrolling on a
//! phone, and the token gate. Screenshots go to `target/dashboard/` for a person to look
//! at. Skipped (with a message) when Chromium is not installed, unless
//! `WEIR_REQUIRE_CHROMIUM` is set.

mod support_browser;
mod support_process;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support_browser::Browser;
use support_process::{call, get, TempDir, Weir};
use weir_testkit::certs::{LeafOptions, TestCa};
use weir_testkit::Backend;

/// Enter, in WebDriver's key codes.
const ENTER: &str = "\u{E007}";

/// Where the screenshots go: `target/dashboard/`.
fn shots() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().map_or(tmp.clone(), |t| t.join("dashboard"))
}

/// Requests to `path` every 20 ms until dropped.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(addr: SocketAddr, path: &'static str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = get(addr, path);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A number as the page shows it (`1,234`), if it is one.
fn number(text: Option<String>) -> Option<u64> {
    text?.replace(',', "").trim().parse().ok()
}

fn api(admin: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let headers = [("Content-Type", "application/json")];
    let (head, text) = call(admin, method, &format!("/api/v1{path}"), &headers, body).expect("api");
    (
        head.status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn server_state(admin: SocketAddr, addr: &str) -> Value {
    let (_, health) = api(admin, "GET", "/upstreams/app/health", "");
    let servers = health["data"]["servers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    servers
        .into_iter()
        .find(|s| s["addr"] == addr)
        .map_or(Value::Null, |s| s["state"].clone())
}

/// The config: `web` with routes `api` and `everything`, `secure` (TLS: a file certificate
/// expiring in 5 days and one from the internal CA), upstream `app` with `a` and `b`.
fn config(a: &Backend, b: &Backend, ca: &TestCa, ca_dir: &TempDir) -> String {
    let soon = ca.leaf_with(
        &["soon.example"],
        &LeafOptions {
            not_after_days: 5,
            ..LeafOptions::default()
        },
    );
    format!(
        "[server]\nworkers = 2\n\n[admin]\nbind = \"127.0.0.1:0\"\ndashboard_interval = \"1s\"\n\
         dashboard_history = \"30s\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"api\"\npath_prefix = \"/api/\"\nupstream = \"app\"\n\n\
         [[listeners.routes]]\nname = \"everything\"\nupstream = \"app\"\n\n\
         [[listeners]]\nname = \"secure\"\nbind = \"127.0.0.1:0\"\n\n\
         [listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\n\
         internal_ca = {{ storage = \"{}\" }}\n\n\
         [[listeners.routes]]\nname = \"tls-site\"\nupstream = \"app\"\n\n\
         [upstreams.app]\nservers = [{{ addr = \"{}\" }}, {{ addr = \"{}\" }}]\n",
        soon.cert_path.display(),
        soon.key_path.display(),
        ca_dir.path().display(),
        a.addr(),
        b.addr(),
    )
}

#[test]
fn live_numbers_drain_by_click_and_key_history_and_screenshots() {
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let (ca, ca_dir) = (TestCa::new("Dashboard Test CA"), TempDir::new("dash-ca"));
    let weir = Weir::start(&config(&a, &b, &ca, &ca_dir));
    let admin = weir.admin_addr();
    let _traffic = Traffic::start(weir.addr, "/api/x");
    browser.goto(&format!("http://{admin}/ui/"));

    // Route names, and a request count that rises.
    browser.wait("the routes", |b| {
        b.text("tr[data-route=\"api\"] th").as_deref() == Some("api")
            && b.visible("tr[data-route=\"everything\"]")
            && b.visible("tr[data-route=\"tls-site\"]")
    });
    let count = |b: &Browser| number(b.text("tr[data-route=\"api\"] .requests"));
    browser.wait("requests counted", |b| count(b) > Some(0));
    let first = count(&browser);
    browser.wait("the count to rise", |b| count(b) > first);
    browser.wait("a request rate", |b| {
        b.text("tr[data-route=\"api\"] .rps")
            .and_then(|t| t.parse::<f64>().ok())
            .is_some_and(|r| r > 0.0)
    });
    let caption = browser.text("#listeners-body h3").unwrap_or_default();
    assert!(
        caption.starts_with("web — HTTP on ") && caption.contains(&weir.addr.to_string()),
        "{caption}"
    );

    // Certificates: the file one expiring soon, the internal CA's with its renewal.
    browser.wait("the certificates", |b| {
        let text = b.text("#certs-body").unwrap_or_default();
        text.contains("soon.example") && text.contains("internal") && text.contains("renews at")
    });
    let days = browser.text("#certs-body .st-soon").unwrap_or_default();
    assert!(
        days == "4" || days == "5",
        "days left, marked as soon: {days:?}"
    );

    let (a_addr, b_addr) = (a.addr().to_string(), b.addr().to_string());
    let row = |addr: &str| format!("tr[data-server=\"{addr}\"]");
    let state = |b: &Browser, addr: &str| b.text(&format!("{} .state .badge", row(addr)));
    browser.wait("both servers up", |b| {
        state(b, &a_addr).as_deref() == Some("up") && state(b, &b_addr).as_deref() == Some("up")
    });

    // A page that read version 1 cannot drain once someone else changed the config.
    browser.click("#pause");
    let drain_b = format!("/upstreams/app/servers/{b_addr}");
    assert_eq!(api(admin, "PATCH", &drain_b, r#"{"drain": true}"#).0, 200);
    browser.click(&format!("{} button", row(&a_addr)));
    browser.wait("the stale version refused", |b| {
        b.text("#message")
            .unwrap_or_default()
            .contains("config changed since this page read it")
    });
    browser.wait("the page reloaded the running config", |b| {
        state(b, &b_addr).as_deref() == Some("draining")
    });
    assert_eq!(
        server_state(admin, &a_addr),
        "up",
        "the refused drain changed nothing"
    );
    browser.click("#pause");

    // Undrain b with the mouse, drain a from the keyboard.
    browser.click(&format!("{} button", row(&b_addr)));
    browser.wait("b up again", |b| state(b, &b_addr).as_deref() == Some("up"));
    browser.keys(&format!("{} button", row(&a_addr)), ENTER);
    browser.wait("a draining", |b| {
        state(b, &a_addr).as_deref() == Some("draining")
            && b.text(&format!("{} button", row(&a_addr))).as_deref() == Some("Undrain")
    });
    let message = browser.text("#message").unwrap_or_default();
    assert!(
        message.contains(&format!("{a_addr} of app is draining")),
        "{message}"
    );
    assert_eq!(server_state(admin, &a_addr), "draining");
    let file = std::fs::read_to_string(weir.config_path.as_ref().expect("path")).expect("file");
    assert!(
        file.contains(&format!("{{ addr = \"{a_addr}\", drain = true }}")),
        "{file}"
    );
    assert!(
        !file.contains(&format!("{{ addr = \"{b_addr}\", drain")),
        "{file}"
    );

    // The history: version 4 is the keyboard's drain; its diff names the key.
    browser.wait("version 4 in the history", |b| {
        b.visible("details[data-version=\"4\"]")
    });
    browser.click("details[data-version=\"4\"] summary");
    let diff = browser
        .text("details[data-version=\"4\"] table")
        .unwrap_or_default();
    assert!(
        diff.contains(&format!("upstreams.app.servers[{a_addr}].drain")),
        "{diff}"
    );
    assert_eq!(
        browser
            .text("details[data-version=\"4\"] td.new")
            .as_deref(),
        Some("true")
    );
    assert_eq!(
        browser
            .text("details[data-version=\"4\"] td.old")
            .as_deref(),
        Some("(unset)")
    );

    // The charts fill as samples come (one a second here): wait for ten points of the
    // api route's request rate, so the screenshot shows a trend.
    browser.wait("ten points in a chart", |b| {
        let js = "const l = document.querySelector('tr[data-route=\"api\"] .trend-rps polyline'); \
                  return l ? l.getAttribute('points').split(' ').length : 0;";
        b.script(js, json!([])).as_u64() >= Some(10)
    });
    accessible(&browser);
    browser.screenshot(&shots().join("dashboard-desktop.png"), 1280);
    // A phone: tables scroll inside their boxes, the page itself does not.
    browser.resize(390, 844);
    let overflow = browser.script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
        json!([]),
    );
    assert!(
        overflow.as_i64().is_some_and(|o| o <= 0),
        "the page scrolls sideways by {overflow}px"
    );
    browser.screenshot(&shots().join("dashboard-phone.png"), 390);
}

/// Every control has a name, every chart a description, every table header a scope.
fn accessible(browser: &Browser) {
    let unnamed = browser.script(
        "return [...document.querySelectorAll('button, input')]
            .filter(e => !e.hidden && !(e.getAttribute('aria-label') || e.textContent.trim() || e.labels?.length))
            .map(e => e.outerHTML);",
        json!([]),
    );
    assert_eq!(unnamed, json!([]), "controls without a name");
    let charts = browser.script(
        "return [...document.querySelectorAll('svg.spark')].filter(s => !s.getAttribute('aria-label')).length;",
        json!([]),
    );
    assert_eq!(charts, 0, "charts without a description");
    let headers = browser.script(
        "return [...document.querySelectorAll('th')].filter(t => !t.getAttribute('scope')).length;",
        json!([]),
    );
    assert_eq!(headers, 0, "table headers without a scope");
    assert_eq!(
        browser.script("return document.documentElement.lang;", json!([])),
        "en"
    );
    // WCAG AA: text at least 4.5 times as light as its background (or the reverse).
    let low = browser.script(CONTRAST_JS, json!([]));
    assert_eq!(low, json!([]), "text with too little contrast");
}

/// The text elements whose colour has a contrast ratio under 4.5 with the background they
/// are drawn on (the first opaque one up the tree).
const CONTRAST_JS: &str = r#"
    const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
    const lum = ([r, g, b]) => [r, g, b]
        .map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
        .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
    const background = (e) => {
        for (; e; e = e.parentElement) {
            const c = rgb(getComputedStyle(e).backgroundColor);
            if (c.length === 3 || c[3] > 0) return c;
        }
        return [255, 255, 255];
    };
    const texts = [...document.querySelectorAll('body *')].filter((e) => e.getClientRects().length
        && [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()));
    return texts
        .map((e) => {
            const [a, b] = [lum(rgb(getComputedStyle(e).color)), lum(background(e))];
            const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
            return [e.tagName + '.' + e.className + ' "' + e.textContent.slice(0, 30) + '"', ratio];
        })
        .filter(([, ratio]) => ratio < 4.5)
        .map(([what, ratio]) => what + ' ' + ratio.toFixed(2));
"#;

#[test]
fn the_token_gates_every_number() {
    let Some(browser) = Browser::start(1024, 768) else {
        return;
    };
    let backend = Backend::echo("a");
    let dir = TempDir::new("dash-gate");
    let token = dir.write("token", "c0rrect-token\n");
    let text = format!(
        "[server]\nworkers = 1\n\n[admin]\nbind = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"hidden-route\"\nupstream = \"app\"\n\n\
         [upstreams.app]\nservers = [{{ addr = \"{}\" }}]\n",
        token.display(),
        backend.addr()
    );
    let weir = Weir::start(&text);
    let page = format!("http://{}/ui/", weir.admin_addr());
    let shows = |b: &Browser, what: &str| {
        b.script("return document.body.innerText;", json!([]))
            .as_str()
            .is_some_and(|t| t.contains(what))
    };
    browser.goto(&page);
    browser.wait("the sign-in form", |b| b.visible("#token"));
    assert!(!browser.visible("#dashboard") && !shows(&browser, "hidden-route"));
    browser.screenshot(&shots().join("dashboard-sign-in.png"), 1024);

    browser.keys("#token", &format!("wrong{ENTER}"));
    browser.wait("the refusal", |b| {
        b.text("#login-error")
            .is_some_and(|t| t.contains("not accepted"))
    });
    assert!(
        !shows(&browser, "hidden-route"),
        "nothing shown for a wrong token"
    );

    browser.keys("#token", &format!("c0rrect-token{ENTER}"));
    browser.wait("the dashboard", |b| {
        b.visible("tr[data-route=\"hidden-route\"]")
    });
    let kept = browser.script(
        "return sessionStorage.getItem('weir.admin.token');",
        json!([]),
    );
    assert_eq!(kept, "c0rrect-token", "kept in this tab");
    let where_ = browser.script("return location.href + ' ' + document.cookie;", json!([]));
    assert!(
        !where_.to_string().contains("c0rrect"),
        "never in the URL or a cookie: {where_}"
    );
    // A reload of the tab keeps the session.
    browser.goto(&page);
    browser.wait("the dashboard after a reload", |b| {
        b.visible("tr[data-route=\"hidden-route\"]")
    });

    browser.click("#signout");
    browser.wait("the sign-in form again", |b| b.visible("#token"));
    let kept = browser.script(
        "return sessionStorage.getItem('weir.admin.token');",
        json!([]),
    );
    assert_eq!(kept, Value::Null, "forgotten");
    assert!(!shows(&browser, "hidden-route"), "nothing left on the page");
    browser.goto(&page);
    browser.wait("still signed out after a reload", |b| b.visible("#token"));
}
