//! `ai-sandbox watch` under a real pseudo-terminal: it puts the terminal in single-key mode
//! while it runs, and gives the terminal back (echo, line editing) on every way out, here the
//! gate going away, which once left the terminal without echo.

use nix::sys::termios::{LocalFlags, tcgetattr};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn the_terminal_gets_its_echo_back_when_the_gate_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("gate.sock")).unwrap();
    let pty = nix::pty::openpty(None, None).unwrap();
    let tty = std::fs::File::from(pty.slave);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .arg("watch")
        .env("AISB_RUNTIME_DIR", dir.path())
        .stdin(tty.try_clone().unwrap())
        .stdout(tty.try_clone().unwrap())
        .stderr(tty.try_clone().unwrap())
        .spawn()
        .unwrap();
    // Whatever watch prints goes to the master side; read it so no write can block.
    let master = std::fs::File::from(pty.master);
    let printed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = printed.clone();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut master = master;
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    // A stand-in gate: takes the watch request, answers, then goes away.
    let (conn, _) = listener.accept().unwrap();
    let mut request = String::new();
    BufReader::new(conn.try_clone().unwrap()).read_line(&mut request).unwrap();
    assert!(request.contains("watch"), "{request}");
    (&conn).write_all(b"{\"ok\":true}\n").unwrap();
    let echo = |t: &std::fs::File| tcgetattr(t).unwrap().local_flags.contains(LocalFlags::ECHO);
    // Control: while watch runs, the terminal is in single-key mode (no echo), so the check
    // below can tell a restored terminal from one never changed.
    assert!(wait_until(10, || !echo(&tty)), "watch never put the terminal in single-key mode");
    drop(conn);
    assert!(
        wait_until(10, || child.try_wait().unwrap().is_some()),
        "watch kept running after the gate went away"
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let flags = tcgetattr(&tty).unwrap().local_flags;
    assert!(flags.contains(LocalFlags::ECHO | LocalFlags::ICANON | LocalFlags::ISIG), "{flags:?}");
    assert!(
        wait_until(5, || String::from_utf8_lossy(&printed.lock().unwrap()).contains("the gate went away")),
        "{}",
        String::from_utf8_lossy(&printed.lock().unwrap())
    );
}

#[test]
fn a_session_whose_change_waits_for_review_is_announced_with_its_commands() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("gate.sock")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .arg("watch")
        .env("AISB_RUNTIME_DIR", dir.path())
        .current_dir(elsewhere.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A stand-in gate: answers the watch request, sends a refusal (the control: a line watch
    // has always printed) and a review-mode session's end, then goes away.
    let (conn, _) = listener.accept().unwrap();
    let mut request = String::new();
    BufReader::new(conn.try_clone().unwrap()).read_line(&mut request).unwrap();
    (&conn).write_all(b"{\"ok\":true}\n").unwrap();
    let refused = r#"{"kind":"refused","time":"t","session":"s1","method":"CONNECT","host":"x.test","port":443,"decision":"deny","status":403,"reason":"not allowed"}"#;
    let ended = r#"{"kind":"review","session":"s1","project":"/home/u/my proj"}"#;
    (&conn).write_all(format!("{refused}\n{ended}\n").as_bytes()).unwrap();
    drop(conn);
    // Read until watch says the gate left (it has printed all before), with its input open:
    // at the end of its input watch quits at once.
    let mut text = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        text += &line;
        text.push('\n');
        if line.contains("the gate went away") {
            break;
        }
    }
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(text.contains("refused x.test:443 (session s1)"), "{text}");
    assert!(
        text.contains("session s1 of /home/u/my proj ended; its change waits for your review:"),
        "{text}"
    );
    // Typed elsewhere than in the project, each command names it, quoted for the shell.
    for verb in ["diff", "apply", "discard"] {
        assert!(
            text.contains(&format!("ai-sandbox {verb} --project '/home/u/my proj' s1 ")),
            "{verb}: {text}"
        );
    }
}

/// Piped or redirected with no input (`watch < /dev/null > file`): the refusals still come, as
/// lines, until the gate goes away (it used to print its header and quit at the end of input).
#[test]
fn with_no_input_watch_still_prints_each_refusal_as_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("gate.sock")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .arg("watch")
        .env("AISB_RUNTIME_DIR", dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    let mut request = String::new();
    BufReader::new(conn.try_clone().unwrap()).read_line(&mut request).unwrap();
    (&conn).write_all(b"{\"ok\":true}\n").unwrap();
    // Once watch says its input ended, a refusal; then the gate goes away.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut text = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        text += &format!("{line}\n");
        if line.contains("no more input") {
            break;
        }
    }
    let refused = r#"{"kind":"refused","time":"t","session":"s1","method":"CONNECT","host":"late.test","port":443,"decision":"deny","status":403,"reason":"not allowed"}"#;
    (&conn).write_all(format!("{refused}\n").as_bytes()).unwrap();
    drop(conn);
    for line in lines {
        text += &format!("{}\n", line.unwrap());
    }
    assert_eq!(child.wait().unwrap().code(), Some(0), "{text}");
    assert!(text.contains("no more input: still printing refusals"), "{text}");
    assert!(text.contains("refused late.test:443"), "the refusal after the end of input: {text}");
    assert!(text.contains("the gate went away"), "{text}");
}
