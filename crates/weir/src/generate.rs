//! Files generated from Weir's own definitions, for packaging and editors: shell
//! completions and the man page from the clap command line (`weir completions SHELL`,
//! `weir man`), the JSON Schema of the config file from weir-config's raw structs
//! (`weir schema`). Each is written to stdout; nothing here is maintained by hand.

use std::io::Write;

use clap::ValueEnum;

/// The shells `weir completions` writes a script for.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// `weir completions SHELL`: the completion script for `command`.
pub fn completions(shell: Shell, mut command: clap::Command) -> anyhow::Result<()> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut out);
    print(&out)
}

/// `weir man`: the man page (section 1, roff) of `command` and its subcommands.
pub fn man(command: clap::Command) -> anyhow::Result<()> {
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    render_subcommands(&command, &mut out)?;
    out.write_all(FILES_SECTION.as_bytes())?;
    man.render_version_section(&mut out)?;
    print(&out)
}

/// Each subcommand with its options (clap_mangen's own subcommand section lists only
/// their names and one line each).
fn render_subcommands(command: &clap::Command, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, ".SH COMMANDS")?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        writeln!(out, ".SS \"{} {}\"", command.get_name(), sub.get_name())?;
        if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
            writeln!(out, "{}", roff_text(&about.to_string()))?;
        }
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            let flag = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("\\-{s}, \\-\\-{}", roff_text(l)),
                (None, Some(l)) => format!("\\-\\-{}", roff_text(l)),
                (Some(s), None) => format!("\\-{s}"),
                (None, None) => arg.get_id().to_string().to_uppercase(),
            };
            writeln!(out, ".TP\n\\fB{flag}\\fR")?;
            if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
                writeln!(out, "{}", roff_text(&help.to_string()))?;
            }
        }
    }
    Ok(())
}

/// Text safe in a roff paragraph: backslashes and hyphens escaped, no line starting
/// with a control character.
fn roff_text(text: &str) -> String {
    text.replace('\\', "\\e")
        .replace('-', "\\-")
        .lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const FILES_SECTION: &str = r#".SH FILES
.TP
\fI/etc/weir/weir.toml\fR
The configuration a packaged Weir runs (\fBweir check \-c /etc/weir/weir.toml\fR validates it).
.TP
\fI/var/lib/weir\fR
State: certificates ordered through ACME, the local CA (the systemd unit's StateDirectory).
.SH SIGNALS
SIGTERM and SIGINT drain and exit; SIGHUP reloads the configuration file; SIGUSR1 reopens
the access logs; SIGUSR2 starts a zero\-downtime binary upgrade (\fBweir upgrade\fR).
.SH SEE ALSO
The documentation in docs/ of the source tree: configuration.md, operations.md, tls.md.
"#;

/// `weir schema`: the JSON Schema of the config file, pretty-printed.
pub fn schema() -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(&weir_config::schema())?;
    text.push('\n');
    print(text.as_bytes())
}

/// Writes `bytes` to stdout; a reader that went away (`weir man | head`) is not an error.
/// Every subcommand that prints more than a line writes through it (`weir check`, and
/// `ctl`'s config, tables and JSON through `ctl::out`): `println!` panics on a closed pipe.
pub(crate) fn print(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
