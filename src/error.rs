//! Diagnostics: what failed, where the input came from, and what to do.
//!
//! Every stage reports problems as `Diagnostic`s carrying their `Origin`, so the user sees
//! `.ai-sandbox/config:12: ...` for a config line and `--allow ...` for a flag, each with a hint.

use std::fmt;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A line of `.ai-sandbox/config` (1-based).
    Config(usize),
    /// A command-line flag, e.g. `--allow`.
    Flag(&'static str),
    /// An environment variable, e.g. `AISB_EXTRA_ARGS`.
    Env(&'static str),
}

/// One problem with the user's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub origin: Origin,
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

impl Diagnostic {
    pub(crate) fn new(origin: Origin, message: impl Into<String>) -> Self {
        Diagnostic { origin, message: message.into(), hint: None }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// `config_path:LINE: message` (or `--flag: message`), then the hint on its own line.
    /// Quoted values longer than a line are elided, so a 2 MB value is not echoed back.
    pub(crate) fn render(&self, config_path: &str) -> String {
        let place = match &self.origin {
            Origin::Config(line) => format!("{config_path}:{line}: "),
            Origin::Flag(f) => format!("{f}: "),
            Origin::Env(v) => format!("{v}: "),
        };
        let message = elide_quoted(&self.message);
        match &self.hint {
            Some(h) => format!("{place}{message}\n  hint: {}", elide_quoted(h)),
            None => format!("{place}{message}"),
        }
    }
}

/// The longest `quoted` span shown whole.
const SHOWN: usize = 80;

/// Shortens every backtick-quoted span longer than SHOWN to its start, `…`, its end and its
/// length, leaving the words around it intact.
fn elide_quoted(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        let n = part.chars().count();
        if i % 2 == 1 && n > SHOWN {
            let head: String = part.chars().take(48).collect();
            let tail: String = part.chars().skip(n - 16).collect();
            out.push_str(&format!("{head}…{tail} [{} bytes]", part.len()));
        } else {
            out.push_str(part);
        }
    }
    out
}

/// An error that says what to do about it. `main` prints it as `ai-sandbox: MESSAGE` and the
/// hint on its own line, like a diagnostic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}\n  hint: {hint}")]
pub(crate) struct Hinted {
    pub(crate) message: String,
    pub(crate) hint: String,
}

/// A `Hinted` error.
pub(crate) fn hinted(message: impl Into<String>, hint: impl Into<String>) -> Hinted {
    Hinted { message: message.into(), hint: hint.into() }
}

/// All the diagnostics of one run, rendered against the config file's display path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) struct Rejected {
    pub(crate) config_path: String,
    pub(crate) diagnostics: Vec<Diagnostic>,
    /// What did not happen because of them: "nothing was started" (a launch) or
    /// "nothing was exported".
    pub(crate) outcome: &'static str,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.diagnostics {
            writeln!(f, "{}", d.render(&self.config_path))?;
        }
        let n = self.diagnostics.len();
        write!(f, "{n} problem{} found; {}", if n == 1 { "" } else { "s" }, self.outcome)
    }
}
