//! The request path as a relative file path beneath the root, or the status refusing it.
//!
//! The path reaches here normalised (`router::normalize`: dot segments resolved,
//! unreserved escapes decoded); what is left is decoded here. Refused: an encoded `/` or
//! `\` (`%2F`, `%5C`: one name must not become two, whatever the listener's
//! `encoded_slash`), a NUL or other control byte, a malformed escape, a `\` (400); a `.`
//! or `..` segment (which normalisation already resolved: refused again here, so no
//! setting of the listener can let one through), and, unless `hidden`, a segment starting
//! with `.` but `.well-known` (404, as if absent). `//` is merged: the relative name never
//! starts with `/`.

/// Appends the relative path of `routed` (the normalised request target, a query left
/// out) to `out`: no leading `/`, a trailing one kept. `Err`: the status to answer.
pub(super) fn plain(routed: &[u8], hidden: bool, out: &mut Vec<u8>) -> Result<(), u16> {
    let path = routed.split(|b| *b == b'?').next().unwrap_or_default();
    let path = path.strip_prefix(b"/").ok_or(400u16)?;
    let mut rest = path;
    while let Some(&b) = rest.first() {
        let byte = match b {
            b'%' => {
                let hex = rest.get(1..3).ok_or(400u16)?;
                rest = &rest[3..];
                hex_byte(hex).ok_or(400u16)?
            }
            _ => {
                rest = &rest[1..];
                b
            }
        };
        if matches!(byte, b'\\' | 0..=0x1f | 0x7f) || (byte == b'/' && b == b'%') {
            return Err(400);
        }
        // `//` merged, and never a leading `/`: an absolute name would leave the root.
        if byte == b'/' && out.last().is_none_or(|l| *l == b'/') {
            continue;
        }
        out.push(byte);
    }
    for segment in out.split(|b| *b == b'/') {
        if segment == b"." || segment == b".." {
            return Err(404);
        }
        if !hidden && segment.first() == Some(&b'.') && segment != b".well-known" {
            return Err(404);
        }
    }
    Ok(())
}

fn hex_byte(hex: &[u8]) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    Some((digit(hex[0])? * 16 + digit(hex[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::plain;

    fn run(path: &str, hidden: bool) -> Result<String, u16> {
        let mut out = Vec::new();
        plain(path.as_bytes(), hidden, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn paths_become_plain_relative_names_or_are_refused() {
        assert_eq!(run("/", false), Ok(String::new()));
        assert_eq!(run("/a/b%20c.txt?x=1", false), Ok("a/b c.txt".into()));
        assert_eq!(run("/dir/", false), Ok("dir/".into()));
        assert_eq!(run("//etc//passwd", false), Ok("etc/passwd".into()));
        assert_eq!(run("/.well-known/x", false), Ok(".well-known/x".into()));
        assert_eq!(run("/.env", true), Ok(".env".into()));
        for (path, status) in [
            ("/a%2Fb", 400),
            ("/a%2fb", 400),
            ("/a%5Cb", 400),
            ("/a\\b", 400),
            ("/a%00", 400),
            ("/a%0a", 400),
            ("/a%zz", 400),
            ("/a%2", 400),
            ("relative", 400),
            ("/../etc/passwd", 404),
            ("/a/./b", 404),
            ("/.git/config", 404),
            ("/a/.env", 404),
        ] {
            assert_eq!(run(path, false), Err(status), "{path}");
        }
    }
}
