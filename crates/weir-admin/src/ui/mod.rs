//! The dashboard's page at `/ui/`: plain HTML, CSS and JavaScript compiled into the binary
//! (`include_str!`), so it needs nothing at run time, no CDN and no network.
//!
//! The page itself holds no data and no secret, so it is served without the token; every
//! number it shows comes from the API (`/api/v1/stats`, `/certs`, `/history`), which the
//! page calls with the token the user typed (kept in the tab's `sessionStorage`, sent as
//! `Authorization: Bearer`, never in a URL). A Content-Security-Policy lets it run only its
//! own script and talk only to this listener. `[admin] dashboard = false` turns it off.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use hyper::{Method, Response, StatusCode};

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: [Asset; 4] = [
    Asset {
        path: "/ui/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("assets/index.html"),
    },
    Asset {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        path: "/ui/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
    Asset {
        path: "/ui/favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("assets/favicon.svg"),
    },
];

/// Only the page's own files; data only from this listener; no frames, forms or plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Serves `/ui` and `/ui/...`; `on`: `[admin] dashboard` is set.
pub fn serve(method: &Method, path: &str, on: bool) -> Response<Full<Bytes>> {
    if !on {
        return text(
            StatusCode::NOT_FOUND,
            "the dashboard is off: set [admin] dashboard = true (the default)\n",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the dashboard is read with GET\n",
        );
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if path == "/ui" {
        let mut r = text(StatusCode::PERMANENT_REDIRECT, "see /ui/\n");
        r.headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/ui/"));
        return r;
    }
    let path = if path == "/ui/index.html" {
        "/ui/"
    } else {
        path
    };
    match ASSETS.iter().find(|a| a.path == path) {
        Some(asset) => {
            let mut r = Response::new(Full::new(Bytes::from_static(asset.body.as_bytes())));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
            // Small files, checked again on each load, so an upgrade's page is used at once.
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            secure(h);
            r
        }
        None => text(
            StatusCode::NOT_FOUND,
            "not found: the dashboard is at /ui/\n",
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    secure(h);
    r
}

/// The headers every dashboard response carries.
fn secure(h: &mut hyper::HeaderMap) {
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_redirect_csp_and_off() {
        let page = serve(&Method::GET, "/ui/", true);
        assert_eq!(page.status(), StatusCode::OK);
        let csp = page.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"));
        for a in &ASSETS {
            // Every file the page names is served, and nothing comes from elsewhere (the
            // SVG namespace is a name, not a download).
            let name = a.path.trim_start_matches("/ui/");
            assert!(
                name.is_empty() || ASSETS[0].body.contains(name),
                "index.html names {name}"
            );
            let body = a.body.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !body.contains("http://") && !body.contains("https://"),
                "{}",
                a.path
            );
        }
        let redirect = serve(&Method::GET, "/ui", true);
        assert_eq!(redirect.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(redirect.headers()[LOCATION], "/ui/");
        assert_eq!(
            serve(&Method::GET, "/ui/nope", true).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            serve(&Method::POST, "/ui/", true).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            serve(&Method::GET, "/ui/", false).status(),
            StatusCode::NOT_FOUND
        );
    }
}
