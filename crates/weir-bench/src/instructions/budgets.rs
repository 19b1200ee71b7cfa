//! The budgets file (`bench/instruction-budgets.toml`: per workload, the instructions per
//! request it may cost and the commit that set the figure) and, beside it, each workload's
//! function profile at that commit (`instruction-profiles/<workload>.txt`), which says what
//! grew when a workload goes over.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use toml_edit::{value, DocumentMut, Item, Table};

use super::callgrind::Functions;

/// One workload's budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub instructions: f64,
    pub commit: String,
}

/// The budgets file, kept as a document so that an update leaves its comments alone.
pub struct Budgets {
    path: PathBuf,
    doc: DocumentMut,
}

/// Functions cheaper than this per request are left out of a stored profile (noise).
const PROFILE_FLOOR: f64 = 1.0;

impl Budgets {
    /// Reads `path`; a missing file is an empty one (the first `--update` writes it).
    pub fn read(path: &Path) -> Result<Budgets> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        let doc = text
            .parse::<DocumentMut>()
            .with_context(|| format!("{}: not valid TOML", path.display()))?;
        Ok(Budgets {
            path: path.to_path_buf(),
            doc,
        })
    }

    /// The budget of `workload`, if the file has one.
    pub fn get(&self, workload: &str) -> Result<Option<Budget>> {
        let Some(t) = self.doc.get(workload) else {
            return Ok(None);
        };
        let bad = || {
            format!(
                "{}: [{workload}] needs instructions = N and commit = \"...\"",
                self.path.display()
            )
        };
        let instructions = t
            .get("instructions")
            .and_then(|v| v.as_integer().map(|i| i as f64).or_else(|| v.as_float()));
        let commit = t.get("commit").and_then(Item::as_str);
        match (instructions, commit) {
            (Some(i), Some(c)) => Ok(Some(Budget {
                instructions: i,
                commit: c.to_string(),
            })),
            _ => anyhow::bail!(bad()),
        }
    }

    /// Sets `workload`'s budget (rounded up to a whole instruction).
    pub fn set(&mut self, workload: &str, b: &Budget) {
        if self.doc.get(workload).is_none() {
            self.doc.insert(workload, Item::Table(Table::new()));
        }
        let t = &mut self.doc[workload];
        t["instructions"] = value(b.instructions.ceil() as i64);
        t["commit"] = value(b.commit.as_str());
    }

    pub fn write(&self) -> Result<()> {
        std::fs::write(&self.path, self.doc.to_string())
            .with_context(|| format!("write {}", self.path.display()))
    }

    fn profile_path(&self, workload: &str) -> PathBuf {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        dir.join("instruction-profiles")
            .join(format!("{workload}.txt"))
    }

    /// The stored function profile of `workload` (empty when there is none).
    pub fn profile(&self, workload: &str) -> Functions {
        std::fs::read_to_string(self.profile_path(workload))
            .map(|t| parse_profile(&t))
            .unwrap_or_default()
    }

    pub fn write_profile(&self, workload: &str, commit: &str, f: &Functions) -> Result<()> {
        let path = self.profile_path(workload);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, format_profile(workload, commit, f))
            .with_context(|| format!("write {}", path.display()))
    }
}

/// One line per function, most expensive first: `instructions-per-request  name`.
fn format_profile(workload: &str, commit: &str, f: &Functions) -> String {
    let mut rows: Vec<(&String, &f64)> =
        f.iter().filter(|(_, v)| v.abs() >= PROFILE_FLOOR).collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    let mut out = format!(
        "# {workload}: exclusive user-space instructions per request by function (callgrind),\n\
         # measured at {commit} by bench/instructions.sh; functions under {PROFILE_FLOOR} left out.\n"
    );
    for (name, v) in rows {
        let _ = writeln!(out, "{v:>10.1}  {name}");
    }
    out
}

fn parse_profile(text: &str) -> Functions {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (v, name) = l.trim_start().split_once("  ")?;
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_keeps_comments_and_other_workloads() {
        let dir = std::env::temp_dir().join(format!("weir-budgets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("budgets.toml");
        std::fs::write(&path, "# why\n[a]\ninstructions = 100\ncommit = \"abc\"\n\n[b]\ninstructions = 7\ncommit = \"def\"\n").unwrap();
        let mut b = Budgets::read(&path).unwrap();
        assert_eq!(b.get("a").unwrap().unwrap().instructions, 100.0);
        assert!(b.get("c").unwrap().is_none());
        b.set(
            "a",
            &Budget {
                instructions: 90.2,
                commit: "fff".into(),
            },
        );
        b.set(
            "c",
            &Budget {
                instructions: 5.0,
                commit: "fff".into(),
            },
        );
        b.write().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# why\n"), "{text}");
        let again = Budgets::read(&path).unwrap();
        assert_eq!(
            again.get("a").unwrap().unwrap(),
            Budget {
                instructions: 91.0,
                commit: "fff".into()
            }
        );
        assert_eq!(again.get("b").unwrap().unwrap().instructions, 7.0);
        assert_eq!(again.get("c").unwrap().unwrap().instructions, 5.0);
        std::fs::write(&path, "[a]\ninstructions = \"many\"\ncommit = \"x\"\n").unwrap();
        assert!(Budgets::read(&path).unwrap().get("a").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_reads_back_as_written() {
        let f: Functions = [
            ("a::b".to_string(), 1234.5),
            ("memcpy".into(), 10.0),
            ("tiny".into(), 0.2),
        ]
        .into();
        let text = format_profile("w", "abc", &f);
        assert!(text.find("a::b").unwrap() < text.find("memcpy").unwrap());
        let back = parse_profile(&text);
        assert_eq!(back.len(), 2);
        assert_eq!(back["a::b"], 1234.5);
        assert_eq!(back["memcpy"], 10.0);
    }
}
