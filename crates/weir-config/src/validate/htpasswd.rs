//! `basic_auth = { users_file, realm }` of a route: the htpasswd file is read and checked
//! when the config is loaded (so `weir check` reports a bad entry with its line, and a
//! reload re-reads it). Only bcrypt and argon2 (PHC string) entries are accepted: the old
//! htpasswd formats (MD5 `$apr1$`, SHA-1 `{SHA}`, crypt, plain text) are fast to brute-force.

use std::path::{Path, PathBuf};

use crate::error::{FieldPath, Issue};
use crate::model::{BasicAuth, HtUser};
use crate::raw::RawBasicAuth;

/// The largest users file read.
const MAX_FILE: u64 = 4 << 20;

const FIX_ENTRY: &str = "create bcrypt entries with `htpasswd -B -C 10 FILE USER`";

pub(super) fn basic_auth(raw: RawBasicAuth, path: &FieldPath) -> Result<BasicAuth, Issue> {
    let realm = raw.realm.unwrap_or_else(|| "Restricted".to_owned());
    let realm_ok = !realm.is_empty()
        && realm.len() <= 128
        && realm
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if !realm_ok {
        return Err(Issue::new(
            &path.key("realm"),
            format!(
                "realm {realm:?} must be 1 to 128 printable ASCII characters without '\"' or '\\'"
            ),
            "use a short name such as \"Restricted\"",
        ));
    }
    let file_path = path.key("users_file");
    let file = raw.users_file.ok_or_else(|| {
        Issue::new(
            &file_path,
            "basic_auth has no users_file",
            "add users_file = \"/etc/weir/htpasswd\"",
        )
    })?;
    let text = read(&file, &file_path)?;
    let users = parse(&text).map_err(|(line, message)| {
        Issue::new(
            &file_path,
            format!("{file} line {line}: {message}"),
            FIX_ENTRY,
        )
    })?;
    Ok(BasicAuth {
        realm,
        users_file: PathBuf::from(file),
        users,
    })
}

fn read(file: &str, path: &FieldPath) -> Result<String, Issue> {
    crate::named_file::read_to_string(Path::new(file), MAX_FILE).map_err(|e| {
        let fix = match e.kind() {
            std::io::ErrorKind::FileTooLarge => "split the users over several routes or files",
            _ => crate::named_file::fix_for(&e)
                .unwrap_or("check the path and that Weir's user may read it"),
        };
        Issue::new(path, format!("cannot read users_file \"{file}\": {e}"), fix)
    })
}

/// The entries of an htpasswd text, sorted by name; `Err((line, message))` on the first
/// bad line. Blank lines and `#` comments are skipped.
fn parse(text: &str) -> Result<Vec<HtUser>, (usize, String)> {
    let mut users: Vec<HtUser> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, hash) = line
            .split_once(':')
            .ok_or((i + 1, "expected NAME:HASH".to_owned()))?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_control()) {
            return Err((i + 1, "empty user name or control characters".to_owned()));
        }
        if !is_bcrypt(hash) && !is_argon2(hash) {
            return Err((
                i + 1,
                format!(
                    "user \"{name}\" does not have a bcrypt ($2y$...) or argon2 \
                     ($argon2id$...) hash with at most 256 MiB of memory"
                ),
            ));
        }
        users.push(HtUser {
            name: name.to_owned(),
            hash: hash.to_owned(),
        });
    }
    users.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = users.windows(2).find(|w| w[0].name == w[1].name) {
        let line = text
            .lines()
            .position(|l| l.trim().starts_with(&format!("{}:", w[1].name)));
        return Err((
            line.map_or(0, |l| l + 1),
            format!("user \"{}\" is listed twice", w[0].name),
        ));
    }
    Ok(users)
}

/// `$2a$`, `$2b$` or `$2y$`, a cost of 04..=31, `$`, and 53 characters of bcrypt's base64.
fn is_bcrypt(hash: &str) -> bool {
    let b = hash.as_bytes();
    let cost = hash.get(4..6).and_then(|c| c.parse::<u8>().ok());
    b.len() == 60
        && matches!(&b[..4], b"$2a$" | b"$2b$" | b"$2y$")
        && cost.is_some_and(|c| (4..=31).contains(&c))
        && b[6] == b'$'
        && b[7..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/')
}

/// An argon2 PHC string, `$argon2id$v=19$m=19456,t=2,p=1$SALT$HASH` (or `argon2i`,
/// `argon2d`), whose memory cost `m` (KiB) is at most 256 MiB: every check allocates it.
fn is_argon2(hash: &str) -> bool {
    let mut fields = hash.split('$');
    let (Some(""), Some(alg)) = (fields.next(), fields.next()) else {
        return false;
    };
    let rest: Vec<&str> = fields.collect();
    let params = rest.iter().find(|f| f.starts_with("m="));
    let memory = params.and_then(|p| {
        p.split(',')
            .find_map(|kv| kv.strip_prefix("m="))?
            .parse::<u32>()
            .ok()
    });
    matches!(alg, "argon2id" | "argon2i" | "argon2d")
        && (rest.len() == 3 || rest.len() == 4)
        && memory.is_some_and(|m| m <= 256 * 1024)
        && hash.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `htpasswd -nbB -C 4 alice secret`.
    const ALICE: &str = "$2y$04$7q1Qb9LJ3rXzHqgW6w5Heu2mIOEbDRt9nN6x3r4bC8QY0bqW6dD7K";

    #[test]
    fn entries_sorted_comments_skipped() {
        let text = format!("# users\n\nbob:{ALICE}\nalice:{ALICE}\n");
        let users = parse(&text).unwrap();
        assert_eq!(
            users.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            ["alice", "bob"]
        );
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(parse("alice").unwrap_err().0, 1);
        let md5 = "bob:$apr1$abc$defghijklmnopqrstuvwx";
        let (line, message) = parse(&format!("alice:{ALICE}\n{md5}\n")).unwrap_err();
        assert_eq!(line, 2);
        assert!(message.contains("bcrypt"), "{message}");
        assert!(parse("carol:{SHA}abc=").is_err());
        assert!(parse(&format!(":{ALICE}")).is_err());
        let (line, message) = parse(&format!("a:{ALICE}\nb:{ALICE}\na:{ALICE}\n")).unwrap_err();
        assert!(message.contains("twice") && line == 1, "{line} {message}");
        assert!(!is_bcrypt(&ALICE.replace("$04$", "$03$")));
        assert!(!is_bcrypt(&ALICE[..59]));
        let argon = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHQ$ZXhhbXBsZWhhc2g";
        assert!(is_argon2(argon));
        assert!(parse(&format!("dora:{argon}")).is_ok());
        assert!(
            !is_argon2(&argon.replace("m=19456", "m=4194304")),
            "4 GiB per check"
        );
        assert!(!is_argon2("$argon2x$v=19$m=8,t=1,p=1$a$b"));
        assert!(!is_argon2("$argon2id$m=8"));
    }
}
