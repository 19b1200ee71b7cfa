//! A real browser for the dashboard tests: Debian's headless `chromium`, driven through
//! `chromedriver` over WebDriver (the W3C protocol: JSON over HTTP), with a small blocking
//! client on the process tests' HTTP helpers.
//!
//! Why WebDriver and not the DevTools protocol: plain HTTP requests (no WebSocket client to
//! write), and clicks and key presses that go through the browser's own input handling, as
//! a person's do. Why no crate (fantoccini, thirtyfour): they are async clients pulling in
//! an HTTP stack with TLS for the dozen calls these tests make.
//!
//! The binaries are `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian packages
//! `chromium`, `chromium-driver`; `WEIR_CHROMIUM` and `WEIR_CHROMEDRIVER` name others).
//! Without them a test prints that it was skipped and passes, unless
//! `WEIR_REQUIRE_CHROMIUM` is set (`.ci/run` sets it once they are installed): then it
//! fails. Chromium runs headless, without sandbox, GPU or any background networking (this
//! machine's network is closed), on a fresh profile removed afterwards.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::support_process::{connect, read_response, TempDir};

/// How long a condition is polled for before the test fails.
pub const BROWSER_WAIT: Duration = Duration::from_secs(30);

/// Bound on one WebDriver call (starting a session takes seconds on a loaded machine).
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

fn binary(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// A Chromium session, ended (and chromedriver stopped) on drop.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: TempDir,
}

impl Browser {
    /// A headless Chromium with a `width` x `height` window, or `None` (skipped) when it
    /// is not installed and not required.
    pub fn start(width: u32, height: u32) -> Option<Browser> {
        let chromium = binary("WEIR_CHROMIUM", "/usr/bin/chromium");
        let chromedriver = binary("WEIR_CHROMEDRIVER", "/usr/bin/chromedriver");
        if !chromium.is_file() || !chromedriver.is_file() {
            let what = format!("{} or {}", chromium.display(), chromedriver.display());
            if std::env::var_os("WEIR_REQUIRE_CHROMIUM").is_some() {
                panic!("WEIR_REQUIRE_CHROMIUM is set but {what} is missing");
            }
            eprintln!("SKIPPED: {what} not found (apt-get install chromium chromium-driver)");
            return None;
        }
        let (driver, addr) = start_driver(&chromedriver);
        let profile = TempDir::new("chromium");
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            format!("--user-data-dir={}", browser._profile.path().display()),
            format!("--window-size={width},{height}"),
        ])
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let created = browser.request("POST", "/session", Some(&caps));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        Some(browser)
    }

    /// One WebDriver command; returns its `value`, panics on an error answer.
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        match self.call(method, path, body) {
            Ok((200, value)) => value,
            Ok((status, value)) => panic!("WebDriver {method} {path}: {status} {value}"),
            Err(e) => panic!("WebDriver {method} {path}: {e}"),
        }
    }

    /// One WebDriver command: the status and the answer's `value`.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let body = body.map_or_else(String::new, Value::to_string);
        let mut s = connect(self.addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(CALL_TIMEOUT))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body.as_bytes())?;
        let (head, body) = read_response(&mut s)?;
        let reply: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((head.status, reply["value"].clone()))
    }

    fn session_request(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.request(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) {
        self.session_request("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `js` (a function body; `arguments[i]` are `args`) in the page; its result.
    pub fn script(&self, js: &str, args: Value) -> Value {
        self.session_request(
            "POST",
            "/execute/sync",
            Some(&json!({"script": js, "args": args})),
        )
    }

    /// The text of the first element matching `css`, if there is one.
    pub fn text(&self, css: &str) -> Option<String> {
        let js = "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;";
        self.script(js, json!([css])).as_str().map(str::to_string)
    }

    /// Whether an element matching `css` is shown (present and not inside `hidden`).
    pub fn visible(&self, css: &str) -> bool {
        let js = "const e = document.querySelector(arguments[0]); \
                  return !!e && e.getClientRects().length > 0;";
        self.script(js, json!([css])) == Value::Bool(true)
    }

    /// The WebDriver id of the first element matching `css`.
    pub fn element(&self, css: &str) -> String {
        let found = self.session_request(
            "POST",
            "/element",
            Some(&json!({"using": "css selector", "value": css})),
        );
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_string()
    }

    /// Clicks the element matching `css` as a mouse would.
    pub fn click(&self, css: &str) {
        let id = self.element(css);
        self.session_request("POST", &format!("/element/{id}/click"), Some(&json!({})));
    }

    /// Types `text` into the element matching `css` from the keyboard (`\u{E007}` is Enter);
    /// the element gets the focus first.
    pub fn keys(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.session_request(
            "POST",
            &format!("/element/{id}/value"),
            Some(&json!({ "text": text })),
        );
    }

    /// Polls `ready` every 100 ms until it holds; fails the test after [`BROWSER_WAIT`],
    /// saying `what` and the page's text.
    pub fn wait(&self, what: &str, mut ready: impl FnMut(&Browser) -> bool) {
        let deadline = Instant::now() + BROWSER_WAIT;
        while !ready(self) {
            if Instant::now() > deadline {
                let page = self.script("return document.body.innerText;", json!([]));
                panic!(
                    "timed out waiting for {what}; the page shows:\n{}",
                    page.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Resizes the window (CSS pixels).
    pub fn resize(&self, width: u32, height: u32) {
        let rect = json!({"width": width, "height": height});
        self.session_request("POST", "/window/rect", Some(&rect));
    }

    /// Writes a PNG of the whole page at `width` CSS pixels (the window is made as tall as
    /// the page) to `path`.
    pub fn screenshot(&self, path: &Path, width: u32) {
        self.resize(width, 800);
        let height = self
            .script("return document.documentElement.scrollHeight;", json!([]))
            .as_u64()
            .unwrap_or(800);
        // A margin: the window's height is not quite the viewport's.
        self.resize(width, (height + 120).clamp(400, 6000) as u32);
        let hide = "window.scrollTo(0, 0); document.documentElement.style.overflow = arguments[0];";
        self.script(hide, json!(["hidden"]));
        let png = self.session_request("GET", "/screenshot", None);
        self.script(hide, json!([""]));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or(""))
            .expect("a base64 PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot directory");
        }
        std::fs::write(path, bytes).expect("write the screenshot");
        eprintln!("screenshot: {}", path.display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Ends Chromium; chromedriver itself is our child and is killed below.
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Starts chromedriver on a free loopback port and waits until it is ready.
fn start_driver(chromedriver: &Path) -> (Child, SocketAddr) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut driver = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn chromedriver");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ready = weir_testkit::wait_until(BROWSER_WAIT, || {
        let Ok(mut s) = connect(addr, Duration::from_secs(1)) else {
            return false;
        };
        let request = format!("GET /status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).is_ok()
            && read_response(&mut s).is_ok_and(|(head, body)| {
                head.status == 200 && String::from_utf8_lossy(&body).contains("\"ready\":true")
            })
    });
    if !ready {
        let _ = driver.kill();
        let _ = driver.wait();
        panic!("chromedriver did not start on {addr}");
    }
    (driver, addr)
}
