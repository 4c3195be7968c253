//! `.ai-sandbox/config`: the line format users already write (`key = value`, keys repeat).
//!
//! This stage only splits text into keyed entries with their line numbers; what a value
//! *means* is decided by `policy`, which reports problems against the same line numbers.
//! Every bad line is collected (not just the first), so a user fixes a file in one pass.

pub(crate) mod init;
pub mod project;

use crate::error::{Diagnostic, Origin};

/// A key's name as the code names it (`policy::keys::Name`): `Config` is read by it, never by
/// a string, so a misspelt key cannot compile.
pub trait KeyName {
    fn key_name(&self) -> &'static str;
}

/// What the reader needs of a key. The registry (`policy::keys::KEYS`, one row per key) gives
/// it: the reader is handed the table rather than importing it, so the registry can check values
/// with the policy's parsers while the policy reads this module's `Config` (no cycle).
pub trait Syntax {
    fn name(&self) -> &'static str;
    /// May appear on many lines (else once).
    fn repeats(&self) -> bool;
    /// Its value is shell-split, so quotes mean something.
    fn shell(&self) -> bool;
}

/// Longer lines are refused without being echoed (no config line needs this much).
const MAX_LINE: usize = 8192;

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) line: usize,
}

/// The parsed file: entries in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub(crate) entries: Vec<Entry>,
}

impl Config {
    /// Values of a repeatable key, with their origin.
    pub(crate) fn all<'a>(&'a self, key: impl KeyName) -> impl Iterator<Item = (&'a str, Origin)> + 'a {
        let key = key.key_name();
        self.entries.iter().filter(move |e| e.key == key).map(|e| (e.value.as_str(), Origin::Config(e.line)))
    }

    /// The value of a single-valued key (duplicates were rejected by `parse`).
    pub(crate) fn one(&self, key: impl KeyName) -> Option<(&str, Origin)> {
        self.all(key).next()
    }
}

/// Parses the whole file. Tolerates a UTF-8 BOM and CRLF line ends. Returns the good
/// entries and a diagnostic per bad line, so later stages can still check the good ones
/// and the user sees every problem in one run.
pub fn parse<K: Syntax>(text: &str, keys: &[K]) -> (Config, Vec<Diagnostic>) {
    let get = |name: &str| keys.iter().find(|k| k.name() == name);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut entries: Vec<Entry> = Vec::new();
    let mut errors = Vec::new();
    for (idx, raw) in text.split('\n').enumerate() {
        let line = idx + 1;
        let at = Origin::Config(line);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.len() > MAX_LINE {
            errors.push(
                Diagnostic::new(at, format!("the line is {} bytes long (at most {MAX_LINE})", raw.len()))
                    .hint("one short `key = value` per line; is this the right file?"),
            );
            continue;
        }
        let content = strip_comment(raw).trim();
        if content.is_empty() {
            continue;
        }
        if content.starts_with('[') && content.ends_with(']') {
            errors.push(
                Diagnostic::new(at, format!("`{content}` looks like a TOML/INI section header")).hint(
                    "this file has no sections: every line is `key = value`, e.g. `allow = github.com`",
                ),
            );
            continue;
        }
        if content.contains('\0') {
            errors.push(Diagnostic::new(at, "the line contains a NUL byte"));
            continue;
        }
        let Some((key, value)) = content.split_once('=') else {
            let hint = match content.split_once(':') {
                Some((k, v)) if get(k.trim()).is_some() => {
                    format!("write `{} = {}` (with `=`, not `:`)", k.trim(), v.trim())
                }
                _ => "every line is `key = value`, e.g. `allow = github.com`".to_string(),
            };
            errors.push(Diagnostic::new(at, format!("expected `key = value`, found `{content}`")).hint(hint));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let Some(spec) = get(key) else {
            errors.push(unknown_key(at, key, keys));
            continue;
        };
        if value.is_empty() {
            errors.push(
                Diagnostic::new(at, format!("`{key}` has an empty value"))
                    .hint("give a value or delete the line"),
            );
            continue;
        }
        let quoted = value.len() >= 2
            && ((value.starts_with('"') && value.ends_with('"'))
                || (value.starts_with('\'') && value.ends_with('\'')));
        if quoted && !spec.shell() {
            let inner = &value[1..value.len() - 1];
            errors.push(
                Diagnostic::new(at, format!("the value of `{key}` is in quotes"))
                    .hint(format!("values are written without quotes: `{key} = {inner}`")),
            );
            continue;
        }
        if let Some(first) = entries.iter().find(|e| !spec.repeats() && e.key == key) {
            errors.push(
                Diagnostic::new(at, format!("duplicate `{key}` (already set on line {})", first.line))
                    .hint(format!("`{key}` takes one value: keep one of the two lines")),
            );
            continue;
        }
        entries.push(Entry { key: key.to_string(), value: value.to_string(), line });
    }
    (Config { entries }, errors)
}

/// `#` starts a comment at the beginning of a line or after whitespace; elsewhere it is
/// part of the value (`env = COLOR=#fff` keeps its `#`).
fn strip_comment(line: &str) -> &str {
    let mut prev_ws = true;
    for (i, c) in line.char_indices() {
        if c == '#' && prev_ws {
            return &line[..i];
        }
        prev_ws = c.is_whitespace();
    }
    line
}

fn unknown_key<K: Syntax>(at: Origin, key: &str, keys: &[K]) -> Diagnostic {
    let d = Diagnostic::new(at, format!("unknown key `{key}`"));
    match keys.iter().map(|k| (k.name(), edit_distance(key, k.name()))).min_by_key(|(_, d)| *d) {
        Some((k, dist)) if dist <= 2 || k.starts_with(key) => d.hint(format!("did you mean `{k}`?")),
        _ => {
            let names: Vec<&str> = keys.iter().map(|k| k.name()).collect();
            d.hint(format!("known keys: {}", names.join(", ")))
        }
    }
}

/// Levenshtein distance, for "did you mean" hints.
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::KEYS;

    #[test]
    fn parses_repeated_keys_comments_crlf_and_bom() {
        let text =
            "\u{feff}# top\r\nallow = github.com   # inline\r\nallow = *.npmjs.org\n\nenv = COLOR=#fff\n";
        let (c, errs) = parse(text, KEYS);
        assert!(errs.is_empty(), "{errs:?}");
        let got: Vec<_> = c.entries.iter().map(|e| (e.key.as_str(), e.value.as_str(), e.line)).collect();
        assert_eq!(
            got,
            vec![("allow", "github.com", 2), ("allow", "*.npmjs.org", 3), ("env", "COLOR=#fff", 5)]
        );
    }

    #[test]
    fn reports_every_bad_line_with_hints() {
        let (cfg, errs) = parse("alow = x\nnet = allow\nnet = none\njunk\nimage =\n", KEYS);
        assert_eq!(cfg.entries.len(), 1, "the good line is kept");
        let text: Vec<String> = errs.iter().map(|d| d.render(".ai-sandbox/config")).collect();
        assert_eq!(errs.len(), 4, "{text:#?}");
        assert!(text[0].starts_with(".ai-sandbox/config:1: unknown key `alow`"));
        assert!(text[0].contains("did you mean `allow`?"));
        assert!(text[1].contains(":3: duplicate `net` (already set on line 2)"));
        assert!(text[2].contains(":4: expected `key = value`"));
        assert!(text[3].contains(":5: `image` has an empty value"));
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("alow", "allow"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
