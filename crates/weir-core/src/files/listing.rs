//! The listing of a directory without an index (`listing = true`; off by default): an
//! HTML page of its entries, names escaped for HTML and links percent-encoded, hidden
//! entries left out unless `hidden = true`, at most `MAX_ENTRIES`.

use std::fmt::Write;

use weir_config::Files;

use super::body::Body;
use super::{Opened, Reply};

/// Most entries one listing shows.
const MAX_ENTRIES: usize = 10_000;

/// The listing of `dir`, asked as `routed` (a path ending in `/`).
pub(super) fn reply(dir: &Opened, routed: &[u8], cfg: &Files) -> Reply {
    let path = routed.split(|b| *b == b'?').next().unwrap_or_default();
    let path = String::from_utf8_lossy(path);
    let Some(mut names) = entries(dir, cfg.hidden) else {
        return Reply::status(404, b"", cfg);
    };
    names.sort();
    let mut page = String::with_capacity(256 + names.len() * 64);
    let title = html(&path);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<ul>\n"
    );
    if path != "/" {
        page.push_str("<li><a href=\"../\">../</a></li>\n");
    }
    for (name, is_dir) in &names {
        let slash = if *is_dir { "/" } else { "" };
        let _ = writeln!(
            page,
            "<li><a href=\"{}{slash}\">{}{slash}</a></li>",
            link(name),
            html(name)
        );
    }
    page.push_str("</ul></body></html>\n");
    let mut reply = Reply::status(200, b"", cfg);
    let body = page.into_bytes();
    reply.head = listing_head(body.len());
    reply.body = Body::Text(body);
    reply
}

fn listing_head(len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nCache-Control: no-cache\r\nContent-Length: {len}\r\n\r\n"
    )
    .into_bytes()
}

/// The directory's entries (name, is a directory), hidden ones only when `hidden`.
fn entries(dir: &Opened, hidden: bool) -> Option<Vec<(String, bool)>> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", dir.file.as_raw_fd());
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).ok()?.flatten().take(MAX_ENTRIES) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !hidden && name.starts_with('.') {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        out.push((name, is_dir));
    }
    Some(out)
}

/// `text` escaped for HTML text and attribute values.
fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `name` as one path segment of a link: everything but unreserved characters encoded.
fn link(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_escaped_for_html_and_links() {
        assert_eq!(
            super::html("<a href='x'>&\""),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;"
        );
        assert_eq!(super::link("a b/<c>.txt"), "a%20b%2F%3Cc%3E.txt");
    }
}
