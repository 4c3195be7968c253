//! docs/networking.md is executable: every `console` block runs verbatim, as the test user, in
//! a fresh project, and each line the doc shows under a command must be a whole line of that
//! command's output, where `…` stands for any text (a path, a time, an id); `[exit N]` asserts
//! the exit code, otherwise it must be 0. The doc and the tool cannot drift, and the doc
//! cannot show a fragment of a line as if it were the output.

use crate::harness::*;

struct Cmd {
    line: String,
    expect: Vec<String>,
    exit: i32,
}

fn console_blocks(md: &str) -> Vec<Vec<Cmd>> {
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<Cmd>> = None;
    for l in md.lines() {
        match (&mut cur, l.trim_end()) {
            (None, "```console") => cur = Some(Vec::new()),
            (Some(_), "```") => blocks.push(cur.take().unwrap()),
            (Some(cmds), l) if l.starts_with("$ ") => {
                cmds.push(Cmd { line: l[2..].to_string(), expect: vec![], exit: 0 })
            }
            (Some(cmds), l) => {
                let c = cmds.last_mut().expect("output before any command");
                match l.strip_prefix("[exit ").and_then(|r| r.strip_suffix(']')) {
                    Some(code) => c.exit = code.parse().unwrap(),
                    None => c.expect.push(l.to_string()),
                }
            }
            _ => {}
        }
    }
    assert!(cur.is_none(), "unterminated console block");
    blocks
}

/// `expected` with `…` as "any text" matches the whole of `line` (indentation aside).
fn whole_line_matches(expected: &str, line: &str) -> bool {
    let parts: Vec<&str> = expected.trim().split('…').collect();
    let line = line.trim();
    if parts.len() == 1 {
        return line == parts[0];
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || !line.ends_with(last) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[test]
fn the_whole_line_matcher_is_strict() {
    assert!(whole_line_matches("a … c", "a b c"));
    assert!(whole_line_matches("exact", "exact"));
    assert!(!whole_line_matches("exact", "exact and more"), "a fragment is not the line");
    assert!(!whole_line_matches("deny  403", "…Z deny  403 session=x"));
    assert!(whole_line_matches("…Z deny  403 session=… GET x", "2026Z deny  403 session=ab GET x"));
    assert!(!whole_line_matches("a…b…c", "a c b"));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn every_command_in_the_networking_guide_does_what_the_guide_says() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/networking.md")).unwrap();
    let blocks = console_blocks(&md);
    assert!(blocks.len() >= 8, "the guide lost its examples ({} blocks)", blocks.len());
    let _pg = Banner::start_on(5432, "hello from the host's 127.0.0.1:5432\n");
    for (i, block) in blocks.iter().enumerate() {
        let p = Project::new(&format!("doc{i}"));
        let mut script = String::new();
        for c in block {
            script += &format!("{}\necho \"@@@rc=$?\"\n", c.line);
        }
        let r = user_command(
            &p.dir,
            std::path::Path::new("/bin/bash"),
            &["-c", &format!("exec 2>&1\n{script}")],
            &[],
        )
        .output()
        .unwrap();
        let out = String::from_utf8_lossy(&r.stdout).to_string();
        let parts: Vec<&str> = out.split("@@@rc=").collect();
        assert_eq!(parts.len(), block.len() + 1, "block {i} did not run to the end:\n{out}");
        for (k, c) in block.iter().enumerate() {
            // Part k holds command k's output (after the previous marker's rc line).
            let text = if k == 0 { parts[0] } else { parts[k].split_once('\n').map(|x| x.1).unwrap_or("") };
            let rc: i32 = parts[k + 1].lines().next().unwrap().trim().parse().unwrap();
            assert_eq!(rc, c.exit, "`{}` exited {rc}, the guide says {}:\n{text}", c.line, c.exit);
            for e in &c.expect {
                assert!(
                    text.lines().any(|l| whole_line_matches(e, l)),
                    "`{}`: expected the whole line {e:?}, got:\n{text}",
                    c.line
                );
            }
        }
    }
}
