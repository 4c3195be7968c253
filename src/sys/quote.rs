//! Printing what a sandbox named. A file name, a git setting or a request path made inside can
//! hold any byte but `/` and NUL: an `ESC ] 0;` sets the terminal's title, `ESC [2K` erases the
//! line that warned the user, OSC 52 writes the clipboard, a bidi override shows a name other
//! than the one on disk. Every such thing the host prints goes through `text` or `path`.
//!
//! What is escaped: C0 controls and DEL (`\n`, `\t`, `\r`, `\e`, else `\xNN`), C1 controls
//! (`\u{85}`), the bidi and zero-width format characters (`\u{202e}`), the backslash itself (so
//! that an escape cannot be forged), and, in paths, each byte that is not UTF-8 (`\xff`).
//! Everything else, including non-ASCII letters, is printed as it is.

use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether a character is printed escaped.
fn escaped(c: char) -> bool {
    c.is_control()
        || c == '\\'
        // bidi embeddings, overrides and isolates; marks; zero-width and invisible formatters
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}' | '\u{061c}')
}

fn push(out: &mut String, c: char) {
    match c {
        c if !escaped(c) => out.push(c),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '\u{1b}' => out.push_str("\\e"),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// A string as it may be printed: unchanged when it holds nothing to escape.
pub fn text(s: &str) -> String {
    if !s.chars().any(escaped) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push(&mut out, c);
    }
    out
}

/// A line of a file's content as a patch shows it: like `text`, except that a tab and a
/// backslash print as they are (source code is full of both, and a patch names no path).
pub fn line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' | '\\' => out.push(c),
            c => push(&mut out, c),
        }
    }
    out
}

/// A path as it may be printed: like `text`, and each byte that is not UTF-8 as `\xNN`.
pub fn path(p: &Path) -> String {
    bytes(p.as_os_str().as_bytes())
}

/// Bytes as they may be printed (see `path`).
pub fn bytes(mut b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(&text(s));
                return out;
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                out.push_str(&text(std::str::from_utf8(good).unwrap_or_default()));
                let bad = e.error_len().unwrap_or(rest.len());
                for byte in &rest[..bad] {
                    let _ = write!(out, "\\x{byte:02x}");
                }
                b = &rest[bad..];
            }
        }
    }
}

/// A path as a shell takes it back: printed as `path` does when that is also a word a shell
/// reads as itself; in single quotes when it holds spaces or shell syntax; and as `$'…'` (bash,
/// zsh) when it holds anything `path` escapes, so that a name the sandbox chose can be pasted
/// into `ai-sandbox apply` and still draws nothing on the terminal. A name that starts with `-`
/// is printed as `./-name`, so that it is not read as an option.
pub fn arg(p: &Path) -> String {
    let b = p.as_os_str().as_bytes();
    if b.first() == Some(&b'-') {
        // Not an option, however quoted.
        return arg(&Path::new(".").join(p));
    }
    let plain = |c: u8| c.is_ascii_alphanumeric() || b"_-./+,:@%=^".contains(&c) || c >= 0x80;
    let printed = path(p);
    if !b.is_empty() && printed.len() == b.len() && b.iter().all(|c| plain(*c)) {
        return printed;
    }
    if printed.len() == b.len() && std::str::from_utf8(b).is_ok() {
        // Nothing to escape: only the shell's own syntax to keep.
        return format!("'{}'", printed.replace('\'', "'\\''"));
    }
    let mut out = String::from("$'");
    let mut rest = b;
    while !rest.is_empty() {
        let (s, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, 0),
            Err(e) => {
                let good = e.valid_up_to();
                (
                    std::str::from_utf8(&rest[..good]).unwrap_or_default(),
                    e.error_len().unwrap_or(rest.len() - good),
                )
            }
        };
        for c in s.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                c if !escaped(c) => out.push(c),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\u{1b}' => out.push_str("\\e"),
                c if (c as u32) < 0x80 => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
            }
        }
        let at = s.len();
        for byte in &rest[at..at + bad] {
            let _ = write!(out, "\\x{byte:02x}");
        }
        rest = &rest[at + bad..];
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_patch_line_keeps_tabs_and_backslashes_and_escapes_the_rest() {
        assert_eq!(line("\tlet s = \"a\\n\";"), "\tlet s = \"a\\n\";");
        assert_eq!(line("x\u{1b}]0;owned\u{7}y"), "x\\e]0;owned\\x07y");
        assert_eq!(line("a\u{202e}b\r"), "a\\u{202e}b\\r");
        assert_eq!(line("plain"), "plain");
    }

    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn plain_text_is_unchanged() {
        for s in ["src/main.rs", "héllo wörld", "日本語/ファイル", "a b"] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn control_and_format_characters_are_escaped() {
        let cases = [
            ("a\u{1b}]0;pwned\u{7}b", "a\\e]0;pwned\\x07b"),
            ("x\u{1b}[2Ky", "x\\e[2Ky"),
            ("line\nnext", "line\\nnext"),
            ("tab\there\r", "tab\\there\\r"),
            ("del\u{7f}", "del\\x7f"),
            ("c1\u{85}\u{9b}", "c1\\u{85}\\u{9b}"),
            // the first C1 control, just past ASCII: a code point, not a byte
            ("\u{80}\u{7f}", "\\u{80}\\x7f"),
            ("evil\u{202e}txt.exe", "evil\\u{202e}txt.exe"),
            ("iso\u{2066}x\u{2069}", "iso\\u{2066}x\\u{2069}"),
            ("zw\u{200b}j", "zw\\u{200b}j"),
            ("back\\e[2K", "back\\\\e[2K"),
        ];
        for (raw, want) in cases {
            assert_eq!(text(raw), want, "{raw:?}");
            assert!(!text(raw).chars().any(|c| c.is_control()), "{raw:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_escaped() {
        let p = Path::new(OsStr::from_bytes(b"a\xffb\xc3(\x1bc/\xe2\x82"));
        assert_eq!(path(p), "a\\xffb\\xc3(\\ec/\\xe2\\x82");
        assert_eq!(path(Path::new("ok/é")), "ok/é");
    }

    #[test]
    fn an_argument_is_printed_as_a_shell_reads_it_back_and_draws_nothing() {
        let a = |b: &[u8]| arg(Path::new(OsStr::from_bytes(b)));
        assert_eq!(a(b"src/main.rs"), "src/main.rs");
        assert_eq!(a("ok/é".as_bytes()), "ok/é");
        assert_eq!(a(b"my file.txt"), "'my file.txt'");
        assert_eq!(a(b"it's"), "'it'\\''s'");
        assert_eq!(a(b"$(rm -rf ~)"), "'$(rm -rf ~)'");
        assert_eq!(a(b"-rf"), "./-rf", "not taken for an option");
        assert_eq!(a(b"-a b"), "'./-a b'");
        assert_eq!(a(b""), "''");
        assert_eq!(a(b"a\x1b[2Kb"), "$'a\\e[2Kb'");
        assert_eq!(a(b"x\\y z"), "$'x\\\\y z'");
        assert_eq!(a(b"q'\n"), "$'q\\'\\n'");
        assert_eq!(a("r\u{202e}t".as_bytes()), "$'r\\u202et'");
        assert_eq!(a(b"\xffz"), "$'\\xffz'");
        // A sequence cut short at the end, after text; an ASCII control; the first C1 control.
        assert_eq!(a(b"ab\xe2\x82"), "$'ab\\xe2\\x82'");
        assert_eq!(a(b"a\x01b"), "$'a\\x01b'");
        assert_eq!(a("a\u{80}b".as_bytes()), "$'a\\u0080b'");
        assert_eq!(a("a\u{7f}b".as_bytes()), "$'a\\x7fb'");
        // What a shell makes of each is the name itself.
        for name in [
            &b"my file.txt"[..],
            b"it's",
            b"a\x1b[2Kb",
            b"x\\y z",
            b"q'\n",
            b"\xffz",
            b"ab\xe2\x82",
            b"a\x01b",
            "a\u{80}b".as_bytes(),
            "r\u{202e}t".as_bytes(),
            b"-rf",
        ] {
            let out = std::process::Command::new("bash")
                .args(["-c", &format!("printf %s {}", a(name))])
                .output()
                .unwrap();
            let back = out.stdout.strip_prefix(b"./".as_slice()).unwrap_or(&out.stdout);
            assert_eq!(back, name, "{}", a(name));
            assert!(!a(name).chars().any(|c| c.is_control()));
        }
    }
}
