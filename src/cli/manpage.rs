//! `ai-sandbox man`: the man page, from the same clap definition as `--help`, plus the sections
//! a man page is read for (COMMANDS, ENVIRONMENT, FILES, EXIT STATUS). clap_mangen's own
//! subcommand section points at one page per subcommand, which are not shipped; commands are
//! described here instead.

use crate::cli::{Cli, ENVIRONMENT, EXAMPLES, EXIT_STATUS, FILES};
use clap::CommandFactory;
use std::io::Write;

/// Escapes text for roff (backslashes, leading dots and quotes, hyphens, and every character
/// beyond ASCII as its `\[uXXXX]` name, which troff reads without a preprocessor).
fn roff(text: &str) -> String {
    let t: String = text
        .replace('\\', "\\\\")
        .replace('-', "\\-")
        .chars()
        .map(|c| if c.is_ascii() { c.to_string() } else { format!("\\[u{:04X}]", c as u32) })
        .collect();
    if t.starts_with('.') || t.starts_with('\'') { format!("\\&{t}") } else { t }
}

fn section(w: &mut dyn Write, title: &str, items: &[(String, String)]) -> std::io::Result<()> {
    writeln!(w, ".SH {title}")?;
    for (k, v) in items {
        writeln!(w, ".TP\n\\fB{}\\fR\n{}", roff(k), roff(v))?;
    }
    Ok(())
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The keys of `.ai-sandbox/config`, as the parser knows them (`policy::keys::KEYS`).
fn config_keys() -> Vec<(String, String)> {
    let mut out = vec![(
        ".ai-sandbox/config".to_string(),
        "one `key = value` per line; `#` after whitespace starts a comment; repeatable keys may appear on many lines. The keys:".to_string(),
    )];
    for crate::policy::keys::Key { name: k, repeats, doc, example, .. } in crate::policy::keys::KEYS {
        let k = k.as_str();
        let name = format!("{k} = …{}", if *repeats { " (repeatable)" } else { "" });
        out.push((name, format!("{doc}. Example: `{k} = {example}`")));
    }
    out
}

/// The commented example of every key (the repository's config.example), for
/// `ai-sandbox help config-example`: a user with the binary alone has it too.
pub const CONFIG_EXAMPLE: &str = include_str!("../../config.example");

/// `ai-sandbox help config`: the same list, for a terminal.
pub fn config_help() -> String {
    let width = crate::policy::keys::KEYS.iter().map(|k| k.name.as_str().len()).max().unwrap_or(0);
    let mut out = String::from(
        ".ai-sandbox/config: one `key = value` per line (`#` after whitespace starts a comment).\n\
         Keys marked * may repeat. A commented example of every key: `ai-sandbox help config-example`.\n\n",
    );
    for crate::policy::keys::Key { name: k, repeats, doc, example, .. } in crate::policy::keys::KEYS {
        let pad = " ".repeat(width + 5);
        out += &format!(
            "  {k:<width$} {} {doc}\n{pad}e.g. `{k} = {example}`\n",
            if *repeats { "*" } else { " " }
        );
    }
    out
}

pub fn render(w: &mut dyn Write) -> std::io::Result<()> {
    let cmd = Cli::command();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    let commands: Vec<(String, String)> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| {
            let sub: Vec<&str> =
                c.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name()).collect();
            let name = if sub.is_empty() {
                c.get_name().to_string()
            } else {
                format!("{} {}", c.get_name(), sub.join(" | "))
            };
            (name, c.get_about().map(|a| a.to_string()).unwrap_or_default())
        })
        .collect();
    section(w, "COMMANDS", &commands)?;
    writeln!(w, ".SH EXAMPLES\n.nf")?;
    for line in EXAMPLES.lines().skip(1) {
        writeln!(w, "{}", roff(line.trim_start()))?;
    }
    writeln!(w, ".fi")?;
    section(w, "CONFIGURATION", &config_keys())?;
    section(w, "ENVIRONMENT", &pairs(ENVIRONMENT))?;
    section(w, "FILES", &pairs(FILES))?;
    section(w, "EXIT STATUS", &pairs(EXIT_STATUS))?;
    man.render_version_section(w)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_is_plain_ascii_roff_with_the_keys_escaped() {
        let mut out = Vec::new();
        super::render(&mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        // troff reads ASCII only without a preprocessor (`…` gave "invalid input character").
        let odd: Vec<char> = page.chars().filter(|c| !c.is_ascii()).collect();
        assert!(odd.is_empty(), "characters beyond ASCII: {odd:?}");
        assert!(page.contains("\\fBallow = \\[u2026] (repeatable)\\fR"), "the keys are in it, escaped");
        assert_eq!(super::roff("a-b \\ .x"), "a\\-b \\\\ .x");
        assert_eq!(super::roff(".x"), "\\&.x");
    }
}
