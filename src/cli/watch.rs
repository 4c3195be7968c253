//! `ai-sandbox watch`: a second terminal that shows your sandboxes' refusals as the gate decides
//! them and, for a project with `ask = SECONDS`, the requests the gate is holding for an answer
//! (see `gate::ask`). One key answers the oldest held request: `o` lets it through once, `s`
//! allows it for the running sandboxes (a live allow), `a` allows it and adds the line to the
//! config, `d` refuses it; `q` (or Ctrl-C) quits. For a request a host's rules refused, `s` and
//! `a` allow its method and path, and `h` the whole host (`rule = HOST * /**`, added to the
//! config). Without a terminal, one letter per line.

use crate::contract::control::Request;
use crate::contract::watch::{Answer, Question, Verdict, Watch};
use crate::gate::control;
use anyhow::Context;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The terminal in single-key mode for as long as this lives (restored on drop).
struct Raw(Option<nix::sys::termios::Termios>);

impl Raw {
    fn new() -> Raw {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Raw(None);
        }
        let Ok(old) = tcgetattr(&stdin) else { return Raw(None) };
        let mut raw = old.clone();
        // No line editing, no echo, and Ctrl-C as a key (so the terminal is always restored).
        raw.local_flags.remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        Raw(Some(old))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, old);
        }
    }
}

/// The next key: one byte on a terminal, the first character of a line otherwise. `None` when
/// input ends or the gate is `gone`: the caller returns, and the terminal is restored on the way
/// out (a reader thread that exited the process would leave it without echo).
fn next_key(raw: bool, gone: &AtomicBool) -> Option<char> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let stdin = std::io::stdin();
    loop {
        if gone.load(Ordering::SeqCst) {
            return None;
        }
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => break,
            Err(_) => return None,
        }
    }
    if raw {
        let mut b = [0u8; 1];
        return match stdin.lock().read(&mut b) {
            Ok(1) => Some(b[0] as char),
            _ => None,
        };
    }
    let mut line = String::new();
    match stdin.lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().chars().next().unwrap_or(' ')),
    }
}

pub fn run() -> anyhow::Result<i32> {
    let dir = crate::sys::runtime::runtime_dir();
    let mut sock = UnixStream::connect(control::socket_path(&dir)).map_err(|_| {
        crate::error::hinted("no gate is running", "start a sandbox first; the gate starts with it")
    })?;
    sock.write_all(format!("{}\n", serde_json::to_string(&Request::Watch)?).as_bytes())?;
    let mut from_gate = BufReader::new(sock.try_clone()?);
    let mut reply = String::new();
    from_gate.read_line(&mut reply).context("the gate did not answer")?;
    let raw = Raw::new();
    let nl = if raw.0.is_some() { "\r\n" } else { "\n" };
    let say = move |s: &str| {
        let mut out = std::io::stdout().lock();
        // Hosts, methods and paths here are the sandbox's words: escaped, never raw.
        let _ = write!(out, "{}{nl}", crate::sys::quote::text(s));
        let _ = out.flush();
    };
    say(
        "watching your sandboxes' refusals; held requests (ask = SECONDS) are answered with o(nce), s(ession), a(lways: config), d(eny); q quits",
    );
    let held: Arc<Mutex<VecDeque<(Question, std::time::Instant)>>> = Arc::default();
    let queue = held.clone();
    let gone = Arc::new(AtomicBool::new(false));
    let gate_gone = gone.clone();
    std::thread::spawn(move || {
        for line in from_gate.lines().map_while(Result::ok) {
            match Watch::read(&line) {
                Some(Watch::Ask(q)) => {
                    say(&format!(
                        "ASK  {} {}:{}{} from {} (session {}), held up to {} s: {}?",
                        q.method,
                        q.host,
                        q.port,
                        q.path.as_deref().unwrap_or(""),
                        q.project,
                        q.session,
                        q.seconds,
                        if q.path.is_some() { "o/s/a/h/d" } else { "o/s/a/d" }
                    ));
                    queue.lock().unwrap_or_else(|e| e.into_inner()).push_back((q, std::time::Instant::now()));
                }
                Some(Watch::Refused(e)) => {
                    say(&format!(
                        "refused {}:{}{} (session {}): {}",
                        e.host,
                        e.port,
                        e.path.as_deref().map(|p| format!(" {} {p}", e.method)).unwrap_or_default(),
                        e.session,
                        e.fix_or_reason()
                    ));
                }
                Some(Watch::Review(r)) => {
                    let here = std::env::current_dir().ok();
                    say(&format!(
                        "session {} of {} ended; its change waits for your review:",
                        r.session, r.project
                    ));
                    let commands =
                        crate::launch::review::commands(&r.session, Path::new(&r.project), here.as_deref());
                    commands.lines().for_each(&say);
                }
                None => {}
            }
        }
        say(&format!(
            "the gate went away (it stopped, or let this watch go with {} messages unread); run ai-sandbox watch again",
            crate::gate::ask::WATCH_QUEUE
        ));
        gate_gone.store(true, Ordering::SeqCst);
    });
    let mut host = crate::host::RealHost::default();
    loop {
        let Some(key) = next_key(raw.0.is_some(), &gone) else {
            if gone.load(Ordering::SeqCst) || raw.0.is_some() {
                break;
            }
            // No more input (piped, redirected, `< /dev/null`): the refusals still come, and
            // are printed until the gate goes away or the user stops it; nothing can be answered.
            say_no_input(&held);
            while !gone.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            break;
        };
        let verdict = match key {
            'q' | '\u{3}' | '\u{4}' => break,
            'o' => Verdict::Once,
            's' | 'a' | 'h' => Verdict::Allowed,
            'd' => Verdict::Deny,
            _ => continue,
        };
        let Some((q, since)) = held.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
            continue;
        };
        if expired(q.seconds, since.elapsed()) {
            say(&format!(
                "expired: {}:{} was held {} s and refused before this answer; nothing was changed",
                q.host, q.port, q.seconds
            ));
            continue;
        }
        let mut verdict = verdict;
        if verdict == Verdict::Allowed {
            let item = item(key, &q);
            let project = std::path::PathBuf::from(&q.project);
            let args = crate::cli::ChangeArgs {
                items: vec![item],
                session_only: key == 's',
                project: Some(project),
            };
            if let Err(e) = crate::cli::change::change_cmd(&mut host, &args, crate::cli::change::Verb::Allow)
            {
                say(&format!("could not allow it: {e:#}; refused"));
                verdict = Verdict::Deny;
            }
        }
        let answer = Answer { ask: q.ask, verdict };
        sock.write_all(format!("{}\n", serde_json::to_string(&answer)?).as_bytes())?;
        say(&format!("{:?}: {}:{}", verdict, q.host, q.port).to_lowercase());
    }
    Ok(0)
}

/// Said once when input ends: what watch still does, and what it cannot.
fn say_no_input(held: &Mutex<VecDeque<(Question, std::time::Instant)>>) {
    let waiting = held.lock().unwrap_or_else(|e| e.into_inner()).len();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "no more input: still printing refusals as they happen ({waiting} held request(s) wait for their time limit; Ctrl-C quits)"
    );
    let _ = out.flush();
}

/// What `s`, `a` or `h` add for a held request: the line its refusal named; with `h`, for a
/// request a host's rules refused, every method and path of the host.
fn item(key: char, q: &Question) -> String {
    match (key, &q.path) {
        ('h', Some(_)) => format!("rule = {} * /**", q.host),
        _ => q.allow.clone().unwrap_or_else(|| format!("{}:{}", q.host, q.port)),
    }
}

/// Whether a request held for `seconds` was answered by the gate's own refusal already.
fn expired(seconds: u32, elapsed: std::time::Duration) -> bool {
    elapsed >= std::time::Duration::from_secs(u64::from(seconds))
}

#[cfg(test)]
mod tests {
    use crate::gate::ask::Question;

    #[test]
    fn a_rule_refusal_offers_its_method_and_path_or_the_whole_host() {
        let q = Question {
            ask: 1,
            session: "s".into(),
            project: "/p".into(),
            method: "POST".into(),
            host: "api.test".into(),
            port: 443,
            seconds: 5,
            allow: Some("rule = api.test POST /x".into()),
            path: Some("/x".into()),
        };
        assert_eq!(super::item('s', &q), "rule = api.test POST /x");
        assert_eq!(super::item('a', &q), "rule = api.test POST /x");
        assert_eq!(super::item('h', &q), "rule = api.test * /**");
        // The whole-host line is a rule that allows any method and path there.
        let r = crate::policy::rule::parse("api.test * /**").unwrap();
        let any = crate::policy::url_path::normalise("/a/b?c").unwrap();
        assert!(crate::policy::rule::allowing(&r, "api.test", "DELETE", &any).is_some());
        // An allowlist refusal: h is a, the allow line.
        let host = Question { allow: Some("later.test".into()), path: None, ..q };
        assert_eq!(super::item('h', &host), "later.test");
        let none = Question { allow: None, ..host };
        assert_eq!(super::item('a', &none), "api.test:443");
    }

    #[test]
    fn a_request_held_longer_than_its_time_is_expired_not_answered() {
        use std::time::Duration;
        assert!(!super::expired(30, Duration::from_secs(29)));
        assert!(super::expired(30, Duration::from_secs(30)));
        assert!(super::expired(1, Duration::from_millis(1500)));
    }
}
