//! The normaliser as a table (RFC 3986 examples, encoded dots, slashes under each setting,
//! climbing, queries), plus properties over generated paths: normalising is idempotent and
//! the fast path never skips a path the full pass would change.

use super::*;

const DEFAULT: PathNormalization = PathNormalization {
    dot_segments: true,
    merge_slashes: false,
    encoded_slash: EncodedSlash::Reject,
};

fn with(dot_segments: bool, merge_slashes: bool, encoded_slash: EncodedSlash) -> PathNormalization {
    PathNormalization {
        dot_segments,
        merge_slashes,
        encoded_slash,
    }
}

/// The normalised target as text, or the error.
fn normalized(target: &str, s: &PathNormalization) -> Result<String, PathError> {
    let mut out = Vec::new();
    let changed = normalize_into(target.as_bytes(), s, &mut out)?;
    let bytes = if changed { &out[..] } else { target.as_bytes() };
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

#[track_caller]
fn check(s: &PathNormalization, table: &[(&str, Result<&str, PathError>)]) {
    for (input, expected) in table {
        let expected = expected.map(str::to_owned);
        assert_eq!(normalized(input, s), expected, "{input:?} under {s:?}");
    }
}

#[test]
fn rfc3986_dot_segment_examples() {
    // RFC 3986 5.4: the paths the reference examples merge to, against base /b/c/d;p.
    check(
        &DEFAULT,
        &[
            ("/a/b/c/./../../g", Ok("/a/g")),
            ("/b/c/g", Ok("/b/c/g")),
            ("/b/c/./g", Ok("/b/c/g")),
            ("/b/c/./", Ok("/b/c/")),
            ("/b/c/../", Ok("/b/")),
            ("/b/c/..", Ok("/b/")),
            ("/b/c/../g", Ok("/b/g")),
            ("/b/c/./../g", Ok("/b/g")),
            ("/b/c/./g/.", Ok("/b/c/g/")),
            ("/b/c/g/./h", Ok("/b/c/g/h")),
            ("/b/c/g/../h", Ok("/b/c/h")),
            ("/b/c/g;x=1/./y", Ok("/b/c/g;x=1/y")),
            ("/b/c/g;x=1/../y", Ok("/b/c/y")),
            // Not dot segments.
            ("/b/c/g.", Ok("/b/c/g.")),
            ("/b/c/.g", Ok("/b/c/.g")),
            ("/b/c/g..", Ok("/b/c/g..")),
            ("/b/c/..g", Ok("/b/c/..g")),
            ("/b/c/...", Ok("/b/c/...")),
            ("/.well-known/acme", Ok("/.well-known/acme")),
            // RFC 3986 keeps "/g" for these; a proxy refuses them (nginx: 400).
            ("/b/c/../../../g", Err(PathError::ClimbsAboveRoot)),
            ("/../g", Err(PathError::ClimbsAboveRoot)),
        ],
    );
}

#[test]
fn dot_segments_plain_and_encoded() {
    check(
        &DEFAULT,
        &[
            ("/", Ok("/")),
            ("/a/b", Ok("/a/b")),
            ("/public/../admin", Ok("/admin")),
            ("/public/%2e%2e/admin", Ok("/admin")),
            ("/public/%2E%2E/admin", Ok("/admin")),
            ("/public/.%2e/admin", Ok("/admin")),
            ("/public/%2e./admin", Ok("/admin")),
            ("/public/%2E%2e/admin", Ok("/admin")),
            ("/a/./b", Ok("/a/b")),
            ("/a/%2e/b", Ok("/a/b")),
            ("/a/b/..", Ok("/a/")),
            ("/a/b/.", Ok("/a/b/")),
            ("/a/..", Ok("/")),
            ("/.", Ok("/")),
            ("/./", Ok("/")),
            ("/a//b", Ok("/a//b")),
            ("/a//../b", Ok("/a/b")),
            ("/..", Err(PathError::ClimbsAboveRoot)),
            ("/../", Err(PathError::ClimbsAboveRoot)),
            ("/a/../..", Err(PathError::ClimbsAboveRoot)),
            ("/a/%2e%2e/%2E%2E/etc", Err(PathError::ClimbsAboveRoot)),
        ],
    );
}

/// Tomcat and Jetty strip `;parameters` from each segment before resolving `..`.
#[test]
fn dot_segments_with_parameters_are_refused() {
    let refused = Err(PathError::DotSegmentParameters);
    check(
        &DEFAULT,
        &[
            ("/public/..;/admin", refused),
            ("/public/..;jsessionid=x/admin", refused),
            ("/public/.;/admin", refused),
            ("/public/%2e%2e;/admin", refused),
            ("/public/..;", refused),
            ("/a;b/../c", Ok("/c")),
            ("/a/..b;/c", Ok("/a/..b;/c")),
            ("/a/b;../c", Ok("/a/b;../c")),
        ],
    );
    check(
        &with(false, false, EncodedSlash::Reject),
        &[("/public/..;/admin", Ok("/public/..;/admin"))],
    );
}

#[test]
fn escapes_decoded_when_unreserved_upper_cased_otherwise() {
    check(
        &DEFAULT,
        &[
            ("/%7Euser/%41", Ok("/~user/A")),
            ("/caf%c3%a9", Ok("/caf%C3%A9")),
            ("/a%20b", Ok("/a%20b")),
            ("/a%25", Ok("/a%25")),
            ("/a%zz", Err(PathError::BadEscape)),
            ("/a%2", Err(PathError::BadEscape)),
            ("/a%", Err(PathError::BadEscape)),
        ],
    );
}

/// Every escaped C0 control and DEL is refused under every setting, in either hex case
/// and wherever it stands (nginx refuses `%00` alone; Weir all of them: a server decoding
/// the path could cut it at a NUL or put a CR or LF into a log line or a header). Every
/// other escape passes, and so does anything in the query.
#[test]
fn escaped_control_characters_are_refused_under_every_setting() {
    for s in all_settings() {
        for b in 0..=255u8 {
            let control = b < 0x20 || b == 0x7f;
            for path in [
                format!("/a/..%{b:02X}/etc/passwd"),
                format!("/a%{b:02x}"),
                format!("/%{b:02x}/x/../y"),
            ] {
                let got = normalized(&path, &s);
                if control {
                    assert_eq!(got, Err(PathError::EncodedControl), "{path} under {s:?}");
                } else {
                    assert_ne!(got, Err(PathError::EncodedControl), "{path} under {s:?}");
                }
            }
        }
        check(
            &s,
            &[("/a?q=%00", Ok("/a?q=%00")), ("/a?%0d%0a", Ok("/a?%0d%0a"))],
        );
    }
    assert_eq!(
        ProxyError::from(PathError::EncodedControl).status(),
        Some(400)
    );
}

#[test]
fn query_strings_are_untouched() {
    check(
        &DEFAULT,
        &[
            ("/a/../b?x=/../y&z=%2F", Ok("/b?x=/../y&z=%2F")),
            ("/a?../..", Ok("/a?../..")),
            ("/a?%zz%2f", Ok("/a?%zz%2f")),
            ("/%7e?%7e", Ok("/~?%7e")),
            ("/?", Ok("/?")),
        ],
    );
}

#[test]
fn not_paths_and_empty_are_untouched() {
    for s in [DEFAULT, with(true, true, EncodedSlash::Decode)] {
        check(&s, &[("", Ok("")), ("*", Ok("*"))]);
    }
}

#[test]
fn encoded_slash_under_each_setting() {
    check(
        &DEFAULT,
        &[
            ("/public/..%2Fadmin", Err(PathError::EncodedSlash)),
            ("/a%2fb", Err(PathError::EncodedSlash)),
            ("/a%5Cb", Err(PathError::EncodedSlash)),
            ("/a\\b", Err(PathError::EncodedSlash)),
        ],
    );
    check(
        &with(true, false, EncodedSlash::Keep),
        &[
            // Opaque: "..%2Fadmin" is one segment, not a dot segment.
            ("/public/..%2Fadmin", Ok("/public/..%2Fadmin")),
            ("/a%2fb", Ok("/a%2Fb")),
            ("/a\\b", Ok("/a\\b")),
            ("/a/%5c/../b", Ok("/a/b")),
        ],
    );
    check(
        &with(true, false, EncodedSlash::Decode),
        &[
            ("/public/..%2Fadmin", Ok("/admin")),
            ("/a%2Fb", Ok("/a/b")),
            ("/a\\..\\b", Ok("/b")),
            ("/x%5c..%5c..%5cetc", Err(PathError::ClimbsAboveRoot)),
        ],
    );
}

#[test]
fn merge_slashes() {
    check(
        &with(true, true, EncodedSlash::Reject),
        &[
            ("//a///b/", Ok("/a/b/")),
            ("/a//", Ok("/a/")),
            ("///", Ok("/")),
            ("/a/.//../b", Ok("/b")),
            ("/a//b?x//y", Ok("/a/b?x//y")),
        ],
    );
}

#[test]
fn turned_off() {
    check(
        &with(false, false, EncodedSlash::Reject),
        &[
            ("/public/../admin", Ok("/public/../admin")),
            // Unreserved escapes are still decoded.
            ("/public/%2e%2e/admin", Ok("/public/../admin")),
        ],
    );
    // Everything off: the path is used exactly as sent, checked only for escaped controls.
    check(
        &with(false, false, EncodedSlash::Keep),
        &[
            ("/a/%2e%2e/../%zz\\", Ok("/a/%2e%2e/../%zz\\")),
            ("/a/%zz%0a", Err(PathError::EncodedControl)),
            ("/a/%%00", Err(PathError::EncodedControl)),
            ("/a/%2500?%00", Ok("/a/%2500?%00")),
        ],
    );
}

#[test]
fn an_already_normal_path_is_neither_copied_nor_allocated() {
    let mut out = Vec::new();
    for path in ["/", "/a/b/c.html?x=../y", "/.well-known/x", "/a//b"] {
        assert_eq!(
            normalize_into(path.as_bytes(), &DEFAULT, &mut out),
            Ok(false)
        );
    }
    assert_eq!(out.capacity(), 0);
}

#[test]
fn routed_path_reuses_its_buffer() {
    let mut routed = RoutedPath::default();
    assert_eq!(routed.normalize(b"/a/../b", &DEFAULT), Ok(&b"/b"[..]));
    assert_eq!(routed.get(b"/a/../b"), b"/b");
    let capacity = routed.scratch.capacity();
    // The next request's path is normal: its own bytes are used.
    assert_eq!(routed.normalize(b"/c", &DEFAULT), Ok(&b"/c"[..]));
    assert_eq!(routed.get(b"/c"), b"/c");
    assert_eq!(
        routed.normalize(b"/..", &DEFAULT),
        Err(ProxyError::BadRequest("path climbs above the root"))
    );
    assert_eq!(
        routed.get(b"/x/./y"),
        b"/x/./y",
        "a refused path leaves nothing behind"
    );
    assert_eq!(routed.normalize(b"/x/./y", &DEFAULT), Ok(&b"/x/y"[..]));
    assert_eq!(routed.scratch.capacity(), capacity);
}

/// Paths of up to 8 units from an alphabet rich in what normalisation looks at.
fn generated_paths() -> impl Iterator<Item = Vec<u8>> {
    const UNITS: &[&str] = &[
        "/", "/", ".", "..", "a", "%2e", "%2E", "%2F", "%5c", "\\", "%41", "%c3", "%", "?", "//",
        ";", "%00", "%7f",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    std::iter::repeat_with(move || {
        // xorshift64: deterministic, no dependency.
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let len = next() % 9;
        let mut path = b"/".to_vec();
        for _ in 0..len {
            path.extend_from_slice(UNITS[(next() % UNITS.len() as u64) as usize].as_bytes());
        }
        path
    })
    .take(20_000)
}

fn all_settings() -> Vec<PathNormalization> {
    let mut all = Vec::new();
    for dot in [true, false] {
        for merge in [true, false] {
            for slash in [
                EncodedSlash::Reject,
                EncodedSlash::Keep,
                EncodedSlash::Decode,
            ] {
                all.push(with(dot, merge, slash));
            }
        }
    }
    all
}

#[test]
fn normalising_twice_gives_the_same_path() {
    for s in all_settings() {
        for path in generated_paths() {
            let mut once = Vec::new();
            let Ok(changed) = normalize_into(&path, &s, &mut once) else {
                continue;
            };
            let once = if changed { once } else { path.clone() };
            let mut twice = Vec::new();
            let again = normalize_into(&once, &s, &mut twice);
            let show = String::from_utf8_lossy(&path);
            assert_eq!(
                again,
                Ok(false),
                "{show:?} -> {once:?} -> {twice:?} under {s:?}"
            );
        }
    }
}

#[test]
fn the_fast_path_only_skips_paths_the_full_pass_keeps() {
    for s in all_settings().into_iter().filter(|s| !s.is_off()) {
        for path in generated_paths() {
            let path = &path[..path.iter().position(|b| *b == b'?').unwrap_or(path.len())];
            if is_normal(path, &s) {
                let mut out = Vec::new();
                assert_eq!(write_normalized(path, &s, &mut out), Ok(()));
                assert_eq!(out, path, "{:?} under {s:?}", String::from_utf8_lossy(path));
            }
        }
    }
}
