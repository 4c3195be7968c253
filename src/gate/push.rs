//! A push limited by ref (`rule = HOST git-push REPO REF...`), the pure part: the command list
//! at the start of a `git-receive-pack` request body (git's pkt-lines: `OLD NEW REF`, the first
//! with the capabilities after a NUL, then a flush `0000`, then the pack), and the verdict on it.
//!
//! What the gate refuses (docs/adr/0062): a ref no pattern of the rules names, and any deletion
//! (a new id of zeros). What it cannot see: whether an update of an allowed ref rewrites it
//! (git sends the old id the server advertised also with `--force`; only the server, walking
//! the pack, knows), so within the patterns a forced update is the agent's to make: the
//! patterns should name the agent's own refs. A signed push (`push-cert`) is refused: its
//! commands are inside the certificate, which this reader does not take apart.

use super::decide::Denial;

/// One ref update of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub(crate) old: String,
    pub(crate) new: String,
    pub(crate) name: Vec<u8>,
}

impl Command {
    fn deletes(&self) -> bool {
        self.new.bytes().all(|b| b == b'0')
    }
}

/// A push's command list and the capabilities its client asked for (on the first command).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Push {
    pub cmds: Vec<Command>,
    pub(crate) caps: Vec<String>,
}

/// The longest command list the gate reads before it refuses a push (64 KiB: some 550 refs
/// named like `refs/heads/agent/branch-0001`).
pub(crate) const MOST: usize = 64 << 10;

/// The command list in the first bytes of a receive-pack body: `Ok(None)` while its end (the
/// flush) is not in `body` yet, `Err` with what is wrong for a body that is not one.
pub fn commands(body: &[u8]) -> Result<Option<Push>, String> {
    let mut out = Push::default();
    let mut at = 0;
    loop {
        let Some(head) = body.get(at..at + 4) else { return Ok(None) };
        let len = std::str::from_utf8(head)
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .filter(|_| head.iter().all(u8::is_ascii_hexdigit))
            .ok_or("the push does not start with git's command list")?;
        if len == 0 {
            return Ok(Some(out));
        }
        if len < 4 {
            return Err(format!("a pkt-line of length {len}"));
        }
        let Some(line) = body.get(at + 4..at + len) else { return Ok(None) };
        at += len;
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.starts_with(b"shallow ") {
            continue;
        }
        if line.starts_with(b"push-cert") {
            return Err("a signed push (push-cert), whose refs the gate does not read".into());
        }
        // The first command carries the capabilities after a NUL.
        let mut halves = line.splitn(2, |b| *b == 0);
        let line = halves.next().unwrap_or(line);
        if let Some(caps) = halves.next().filter(|_| out.cmds.is_empty()) {
            out.caps = String::from_utf8_lossy(caps)
                .split(' ')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
        }
        let mut words = line.splitn(3, |b| *b == b' ');
        let (Some(old), Some(new), Some(name)) = (words.next(), words.next(), words.next()) else {
            return Err("a command that is not `OLD NEW REF`".into());
        };
        let id = |b: &[u8]| {
            (matches!(b.len(), 40 | 64) && b.iter().all(|c| c.is_ascii_hexdigit()))
                .then(|| String::from_utf8_lossy(b).into_owned())
        };
        let (Some(old), Some(new)) = (id(old), id(new)) else {
            return Err("a command whose object ids are not hex".into());
        };
        if name.is_empty() {
            return Err("a command without a ref".into());
        }
        out.cmds.push(Command { old, new, name: name.to_vec() });
    }
}

/// Why a push is refused: the ref, and what the push would do to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub(crate) name: String,
    pub(crate) deletion: bool,
}

/// The first command the patterns do not allow (a deletion is never allowed).
pub fn check(cmds: &[Command], patterns: &[String]) -> Result<(), Refused> {
    for c in cmds {
        let allowed = patterns.iter().any(|p| crate::policy::rule::ref_matches(p, &c.name));
        if c.deletes() || !allowed {
            return Err(Refused {
                name: String::from_utf8_lossy(&c.name).into_owned(),
                deletion: c.deletes(),
            });
        }
    }
    Ok(())
}

/// git's own answer to a refused push, for a client that asked for a status report: `unpack
/// ok` (nothing was unpacked: the server never saw the push) and each ref `ng` with `why` (the
/// refused one) or as not pushed with it; with a side-band, `why` also as a `remote:` line.
/// git then prints `! [remote rejected] REF (why)` and fails. `None`: the client asked for no
/// report (it then gets the gate's 403).
pub(crate) fn report(push: &Push, refused: &Refused, why: &str) -> Option<Vec<u8>> {
    let has = |c: &str| push.caps.iter().any(|x| x == c);
    if !has("report-status") && !has("report-status-v2") {
        return None;
    }
    let pkt = |payload: &[u8]| [format!("{:04x}", payload.len() + 4).as_bytes(), payload].concat();
    // One line, printable: the reason is the sandbox's ref name and the gate's words.
    let why: String = why.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut inner = pkt(b"unpack ok\n");
    for c in &push.cmds {
        let name = String::from_utf8_lossy(&c.name);
        let reason = if *name == refused.name {
            why.clone()
        } else {
            format!("not pushed: {} was refused", refused.name)
        };
        inner.extend(pkt(format!("ng {name} {reason}\n").as_bytes()));
    }
    inner.extend(b"0000");
    let band = if has("side-band-64k") {
        65515
    } else if has("side-band") {
        995
    } else {
        return Some(inner);
    };
    let mut out = pkt(format!("\x02{why}\n").as_bytes());
    for piece in inner.chunks(band) {
        out.extend(pkt(&[&[1u8][..], piece].concat()));
    }
    out.extend(b"0000");
    Some(out)
}

/// The refusal of a push: what it would do, and the line that would allow it (none for a
/// deletion: a push limited by ref never deletes). `receive` is the request's path
/// (`/REPO/git-receive-pack`).
pub(crate) fn denial(r: &Refused, host: &str, receive: &str, config: &str) -> Denial {
    let repo = receive.strip_suffix("/git-receive-pack").filter(|r| !r.is_empty()).unwrap_or("/");
    let name = crate::sys::quote::text(&r.name);
    if r.deletion {
        return Denial {
            status: 403,
            reason: format!("the push deletes {name}, and a push limited by ref never deletes"),
            hint: format!(
                "blocked by ai-sandbox: this push deletes {name}; a push limited by ref may update the refs its rule names, never delete one (delete it yourself, outside the sandbox)"
            ),
            path: Some(receive.to_string()),
            ..Denial::default()
        };
    }
    let line = format!("rule = {host} git-push {repo} {name}");
    Denial {
        status: 403,
        reason: format!("the push updates {name}, which no push rule for {host} {repo} names"),
        hint: format!(
            "blocked by ai-sandbox: this push updates {name}; to allow it, add \"{line}\" to {config}"
        ),
        allow: Some(line),
        path: Some(receive.to_string()),
        ..Denial::default()
    }
}

/// A push limited by ref whose command list the gate cannot read: refused, with why.
pub(crate) fn unreadable(why: &str, receive: &str) -> Denial {
    Denial {
        status: 403,
        reason: format!("a push limited by ref whose command list the gate cannot read: {why}"),
        hint: format!(
            "blocked by ai-sandbox: the push rules for this repository name the refs it may update, and the gate cannot read which refs this push updates ({why})"
        ),
        path: Some(receive.to_string()),
        ..Denial::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";
    const Z: &str = "0000000000000000000000000000000000000000";

    fn pkt(s: &str) -> String {
        format!("{:04x}{s}", s.len() + 4)
    }

    fn body(lines: &[&str]) -> Vec<u8> {
        let mut b: String = lines.iter().map(|l| pkt(l)).collect();
        b += "0000PACK....";
        b.into_bytes()
    }

    #[test]
    fn the_command_list_is_read_up_to_the_flush_and_not_before() {
        let first = format!("{A} {B} refs/heads/agent/x\0report-status side-band-64k agent=git/2.39\n");
        let b =
            body(&[&first, &format!("{Z} {B} refs/heads/agent/y\n"), &format!("{A} {Z} refs/heads/old\n")]);
        let push = commands(&b).unwrap().unwrap();
        assert_eq!(push.caps, ["report-status", "side-band-64k", "agent=git/2.39"]);
        let cmds = push.cmds;
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds[0], Command { old: A.into(), new: B.into(), name: b"refs/heads/agent/x".to_vec() });
        assert!(!cmds[1].deletes() && cmds[2].deletes());
        // Cut anywhere before the flush: not yet.
        let end = b.len() - "PACK....".len();
        for cut in 0..end {
            assert_eq!(commands(&b[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(commands(&b[..end]).unwrap().unwrap().cmds.len(), 3);
        // A probe (git's "0000" before a large push) holds no command.
        assert_eq!(commands(b"0000"), Ok(Some(Push::default())));
        // Shallow lines are skipped; sha256 ids are read.
        let long = "a".repeat(64);
        let b = body(&[&format!("shallow {A}\n"), &format!("{long} {long} refs/heads/agent/z\0caps\n")]);
        let push = commands(&b).unwrap().unwrap();
        assert_eq!(
            (push.cmds[0].name.as_slice(), push.caps.as_slice()),
            (b"refs/heads/agent/z".as_slice(), ["caps".to_string()].as_slice())
        );
    }

    #[test]
    fn the_most_the_gate_reads_holds_some_550_refs() {
        let list = |n: usize| {
            body(
                &(0..n)
                    .map(|i| format!("{A} {B} refs/heads/agent/branch-{i:04}\n"))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            )
        };
        assert!(list(550).len() <= MOST, "{}", list(550).len());
        assert!(list(600).len() > MOST, "{}", list(600).len());
    }

    #[test]
    fn what_is_not_a_command_list_is_an_error() {
        assert!(commands(b"PACK").is_err());
        assert!(commands(b"0002").is_err());
        assert!(commands(&body(&[&format!("{A} {B}\n")])).is_err());
        assert!(commands(&body(&[&format!("{A} xyz refs/heads/a\n")])).is_err());
        // An id must be both: 40 or 64 characters, and hex.
        let g40 = "g".repeat(40);
        assert!(commands(&body(&[&format!("{A} {g40} refs/heads/a\n")])).is_err());
        let short = "1".repeat(39);
        assert!(commands(&body(&[&format!("{A} {short} refs/heads/a\n")])).is_err());
        assert!(commands(&body(&[&format!("{A} {B} \n")])).is_err());
        assert!(commands(&body(&["push-cert\0caps\n"])).unwrap_err().contains("signed push"));
        assert!(commands(b"00+1").is_err());
    }

    #[test]
    fn refs_outside_the_patterns_and_deletions_are_refused() {
        let pats = vec!["refs/heads/agent/*".to_string()];
        let c = |old: &str, new: &str, name: &str| Command {
            old: old.into(),
            new: new.into(),
            name: name.into(),
        };
        assert_eq!(check(&[c(A, B, "refs/heads/agent/x"), c(Z, B, "refs/heads/agent/a/b")], &pats), Ok(()));
        let main = check(&[c(A, B, "refs/heads/agent/x"), c(A, B, "refs/heads/main")], &pats).unwrap_err();
        assert_eq!(main, Refused { name: "refs/heads/main".into(), deletion: false });
        let del = check(&[c(A, Z, "refs/heads/agent/x")], &pats).unwrap_err();
        assert!(del.deletion && del.name == "refs/heads/agent/x");
        // Tags only when a pattern names them.
        assert!(check(&[c(Z, B, "refs/tags/v1")], &pats).is_err());
        assert!(check(&[c(Z, B, "refs/tags/v1")], &["refs/tags/v*".into()]).is_ok());
        // A name that only starts like a pattern is not under it.
        assert!(check(&[c(A, B, "refs/heads/agentx")], &pats).is_err());
        assert_eq!(check(&[], &pats), Ok(()));
    }

    #[test]
    fn a_refused_push_gets_gits_own_report_in_its_side_band() {
        let c = |name: &str| Command { old: A.into(), new: B.into(), name: name.into() };
        let refused = Refused { name: "refs/heads/main".into(), deletion: false };
        let push = |caps: &[&str]| Push {
            cmds: vec![c("refs/heads/agent/x"), c("refs/heads/main")],
            caps: caps.iter().map(|s| s.to_string()).collect(),
        };
        // No report asked for: none.
        assert_eq!(report(&push(&["side-band-64k"]), &refused, "why"), None);
        // A report without a side-band: the report's pkt-lines as they are.
        let plain = report(&push(&["report-status"]), &refused, "why\nnot").unwrap();
        assert_eq!(
            String::from_utf8(plain.clone()).unwrap(),
            "000eunpack ok\n0042ng refs/heads/agent/x not pushed: refs/heads/main was refused\n001fng refs/heads/main why not\n0000"
        );
        // With side-band-64k: the message on band 2, the report on band 1, then a flush.
        let banded = report(&push(&["report-status-v2", "side-band-64k"]), &refused, "why").unwrap();
        let inner = report(&push(&["report-status"]), &refused, "why").unwrap();
        let mut want = b"0009\x02why\n".to_vec();
        want.extend(format!("{:04x}\x01", inner.len() + 5).as_bytes());
        want.extend(&inner);
        want.extend(b"0000");
        assert_eq!(banded, want);
        // The old side-band's packets are at most 1000 bytes: a long report is cut into several.
        let many = Push {
            cmds: (0..40).map(|i| c(&format!("refs/heads/agent/{i}"))).collect(),
            ..push(&["report-status", "side-band"])
        };
        let long = report(&many, &refused, "why").unwrap();
        let mut at = 0;
        let mut bands = Vec::new();
        while &long[at..at + 4] != b"0000" {
            let n = usize::from_str_radix(std::str::from_utf8(&long[at..at + 4]).unwrap(), 16).unwrap();
            assert!(n <= 1000, "{n}");
            bands.push(long[at + 4]);
            at += n;
        }
        assert!(bands.len() > 2 && bands[0] == 2 && bands[1..].iter().all(|b| *b == 1), "{bands:?}");
    }

    #[test]
    fn a_refusal_names_the_ref_and_the_line_that_allows_it_but_never_for_a_deletion() {
        let update = Refused { name: "refs/heads/main".into(), deletion: false };
        let d = denial(&update, "git.test", "/acme/r.git/git-receive-pack", "/p/.ai-sandbox/config");
        assert_eq!(d.allow.as_deref(), Some("rule = git.test git-push /acme/r.git refs/heads/main"));
        assert_eq!(
            d.hint,
            "blocked by ai-sandbox: this push updates refs/heads/main; to allow it, add \"rule = git.test git-push /acme/r.git refs/heads/main\" to /p/.ai-sandbox/config"
        );
        assert_eq!((d.status, d.askable), (403, false));
        assert_eq!(
            d.reason,
            "the push updates refs/heads/main, which no push rule for git.test /acme/r.git names"
        );
        assert_eq!(d.path.as_deref(), Some("/acme/r.git/git-receive-pack"));
        let del = denial(&Refused { deletion: true, ..update }, "git.test", "/git-receive-pack", "/p/c");
        assert_eq!(del.allow, None);
        assert_eq!((del.status, del.path.as_deref()), (403, Some("/git-receive-pack")));
        assert_eq!(del.reason, "the push deletes refs/heads/main, and a push limited by ref never deletes");
        assert!(del.hint.contains("this push deletes refs/heads/main") && del.hint.contains("never delete"));
        // A push whose refs cannot be read: refused, saying why, for the log's path.
        let u = unreadable("it is compressed", "/r/git-receive-pack");
        assert_eq!(
            (u.status, u.path.as_deref(), u.allow.as_deref()),
            (403, Some("/r/git-receive-pack"), None)
        );
        assert_eq!(
            u.reason,
            "a push limited by ref whose command list the gate cannot read: it is compressed"
        );
        assert!(
            u.hint.starts_with("blocked by ai-sandbox: the push rules for this repository name the refs")
                && u.hint.ends_with("(it is compressed)"),
            "{}",
            u.hint
        );
        // The ref is the sandbox's bytes: printed escaped.
        let odd = Refused { name: "refs/heads/\u{1b}]0;x".into(), deletion: false };
        assert!(denial(&odd, "g.test", "/r/git-receive-pack", "/c").hint.contains("refs/heads/\\e]0;x"));
    }
}
