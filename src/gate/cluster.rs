//! The gate as a cluster service (`gate serve --listen ADDR:PORT --policy FILE`): the same
//! connection code as the local gate (decisions, token check, SSRF guard, SNI check, limits),
//! for sessions defined in a policy file rather than registered over the control socket.
//!
//! What differs, and why: there is no launcher, so no control socket, no per-user lock, no idle
//! exit and no port hand-over; the policy and the tokens are files (a ConfigMap and a Secret);
//! every session must have a token, because a cluster address is reachable by every pod the
//! network lets through, and the gate refuses to start otherwise; the decision log goes to
//! standard output as JSON lines, which is what cluster log collectors read; SIGTERM stops
//! accepting and lets open connections finish for up to `drain` (a rolling update must not cut
//! an agent's download in half), then exits.

use super::decide::SessionPolicy;
use super::log::Log;
use super::state::{Session, State};
use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The policy file: one entry per session (`ai-sandbox export kube` writes one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub sessions: Vec<SessionEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionEntry {
    /// Shown in the log (`session=`).
    pub id: String,
    /// Shown in the log and `gate status` (the project the policy came from).
    pub project: String,
    /// A file holding the proxy password clients present (a mounted Secret); surrounding
    /// whitespace is ignored.
    pub token_file: PathBuf,
    pub policy: SessionPolicy,
    /// Secrets bound to hosts: the gate reads each value from its file (a mounted Secret) and
    /// substitutes the placeholder the agent's Pod holds (see `secrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretEntry>,
    /// Extra roots (PEM) for the bound hosts' servers (`upstream_ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca_file: Option<PathBuf>,
}

/// One bound secret of a cluster session: its value is in a file, never in the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretEntry {
    pub name: String,
    pub placeholder: String,
    pub value_file: PathBuf,
    pub hosts: Vec<String>,
}

/// The CA a cluster gate terminates bound hosts' TLS with: `DIR/ca.pem` and `DIR/ca.key`
/// (`ai-sandbox gate ca DIR` makes them; a Secret mounted into the gate's Pod only).
pub(crate) fn load_ca(dir: &Path) -> anyhow::Result<super::ca::Ca> {
    let read = |n: &str| {
        std::fs::read_to_string(dir.join(n))
            .with_context(|| format!("reading the gate's CA {}", dir.join(n).display()))
    };
    super::ca::Ca::from_pem(&read("ca.pem")?, &read("ca.key")?)
        .with_context(|| format!("the gate's CA in {}", dir.display()))
}

/// `ai-sandbox gate ca DIR`: a new CA for a cluster-mode gate (ca.pem, and ca.key mode 0600),
/// never over files already there.
pub(crate) fn make_ca(dir: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (cert, key) = super::ca::new_pair()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text, mode) in [("ca.key", key, 0o600), ("ca.pem", cert, 0o644)] {
        let path = dir.join(name);
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&path).with_context(
                || format!("creating {} (an existing CA is never overwritten)", path.display()),
            )?;
        f.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// Tokens shorter than this are refused: the token is all that stands between any pod that can
/// reach the gate and the allowlist.
pub(crate) const MIN_TOKEN: usize = 16;

/// Reads and checks the policy file and every session's token.
pub(crate) fn load(path: &Path) -> anyhow::Result<Vec<Session>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the policy {}", path.display()))?;
    let file: PolicyFile =
        serde_json::from_str(&text).with_context(|| format!("{}: not a gate policy", path.display()))?;
    if file.sessions.is_empty() {
        bail!("{}: no sessions: the gate would refuse everything", path.display());
    }
    let mut out: Vec<Session> = Vec::new();
    for e in file.sessions {
        let token = std::fs::read_to_string(&e.token_file)
            .with_context(|| format!("session {}: reading its token {}", e.id, e.token_file.display()))?;
        let token = token.trim().to_string();
        if token.len() < MIN_TOKEN {
            bail!(
                "session {}: the token in {} is {} bytes; at least {MIN_TOKEN} are needed (a gate \
                 reachable from the cluster must not be open to whoever guesses it)",
                e.id,
                e.token_file.display(),
                token.len()
            );
        }
        if out.iter().any(|s| s.token == token || s.id == e.id) {
            bail!("session {}: its id or token is the same as another session's", e.id);
        }
        let mut bound = Vec::new();
        for s in &e.secrets {
            let value = std::fs::read_to_string(&s.value_file).with_context(|| {
                format!("session {}: reading the secret {} from {}", e.id, s.name, s.value_file.display())
            })?;
            let hosts: Vec<&str> = s.hosts.iter().map(String::as_str).collect();
            bound.push(super::secrets::Bound::new(
                &s.name,
                &s.placeholder,
                value.trim_end_matches(['\n', '\r']),
                &hosts,
            ));
        }
        let upstream_ca = match &e.upstream_ca_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("session {}: reading {}", e.id, f.display()))?,
            ),
            None => None,
        };
        let id = e.id.clone();
        let session = Session::new(e.id, e.project, token, e.policy)
            .with_secrets(bound, upstream_ca.as_deref())
            .with_context(|| format!("session {id}"))?;
        if session.secrets.is_empty() != e.secrets.is_empty() {
            bail!(
                "session {id}: a bound secret has an empty value or a placeholder without the aisb_placeholder_ prefix"
            );
        }
        out.push(session);
    }
    Ok(out)
}

pub(crate) fn serve(
    listen: SocketAddr,
    policy: &Path,
    drain: Duration,
    ca: Option<&Path>,
) -> anyhow::Result<i32> {
    let sessions = load(policy)?;
    let ca = match ca {
        Some(dir) => Some(load_ca(dir)?),
        None if sessions.iter().any(|s| !s.secrets.is_empty()) => bail!(
            "{}: a session has bound secrets, and the gate has no CA to open their hosts' TLS with: \
             pass --ca DIR (ca.pem and ca.key, made by `ai-sandbox gate ca DIR`)",
            policy.display()
        ),
        None => None,
    };
    super::server::raise_fd_limit();
    nix::sys::signal::SigSet::all().thread_unblock()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(listen, sessions, drain, ca))
}

async fn run(
    listen: SocketAddr,
    sessions: Vec<Session>,
    drain: Duration,
    ca: Option<super::ca::Ca>,
) -> anyhow::Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let dup = listener.as_fd().try_clone_to_owned()?;
    let state = Arc::new(State::new(listener.local_addr()?.port(), dup, Log::stdout()?));
    if let Some(ca) = ca {
        state.use_ca(ca);
    }
    let all: Vec<Arc<Session>> = sessions.into_iter().map(Arc::new).collect();
    for s in &all {
        state.register(s.clone());
    }
    eprintln!("ai-sandbox gate: listening on {} for {} session(s)", listener.local_addr()?, all.len());
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(super::server::proxy_conn(state.clone(), s));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
    // Stop accepting (the listener and its duplicate close), then let open connections finish.
    drop(listener);
    state.close();
    let end = Instant::now() + drain;
    let open = || all.iter().map(|s| s.active.load(std::sync::atomic::Ordering::SeqCst)).sum::<usize>();
    eprintln!(
        "ai-sandbox gate: no longer accepting; {} open connection(s) may finish within {} s",
        open(),
        drain.as_secs()
    );
    while open() > 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = open();
    eprintln!(
        "ai-sandbox gate: stopped; {}",
        if left == 0 {
            "every connection finished".to_string()
        } else {
            format!("{left} connection(s) cut at the drain limit")
        }
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SessionPolicy {
        SessionPolicy { gate_ports: vec![80, 443], ..SessionPolicy::default() }
    }

    fn write(dir: &Path, token: &str, ids: &[&str]) -> PathBuf {
        std::fs::write(dir.join("token"), token).unwrap();
        let sessions = ids
            .iter()
            .map(|id| SessionEntry {
                id: id.to_string(),
                project: "/p".into(),
                token_file: dir.join("token"),
                policy: policy(),
                secrets: vec![],
                upstream_ca_file: None,
            })
            .collect();
        let path = dir.join("policy.json");
        std::fs::write(&path, serde_json::to_string(&PolicyFile { sessions }).unwrap()).unwrap();
        path
    }

    #[test]
    fn loads_sessions_with_their_tokens() {
        let d = tempfile::tempdir().unwrap();
        let s = load(&write(d.path(), "0123456789abcdef0123\n", &["agent"])).unwrap();
        assert_eq!((s[0].id.as_str(), s[0].token.as_str()), ("agent", "0123456789abcdef0123"));
    }

    #[test]
    fn refuses_short_tokens_shared_tokens_and_no_sessions() {
        let d = tempfile::tempdir().unwrap();
        let e = load(&write(d.path(), "short", &["agent"])).err().unwrap().to_string();
        assert!(e.contains("at least 16"), "{e}");
        let e = load(&write(d.path(), "0123456789abcdef0123", &["a", "b"])).err().unwrap().to_string();
        assert!(e.contains("same as another"), "{e}");
        let e = load(&write(d.path(), "0123456789abcdef0123", &[])).err().unwrap().to_string();
        assert!(e.contains("no sessions"), "{e}");
        std::fs::write(d.path().join("bad.json"), "{\"sessions\": [], \"extra\": 1}").unwrap();
        let e = format!("{:#}", load(&d.path().join("bad.json")).err().unwrap());
        assert!(e.contains("not a gate policy"), "{e}");
    }

    #[test]
    fn a_bound_secret_is_read_from_its_file_and_an_empty_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = write(d.path(), "0123456789abcdef0123", &["agent"]);
        let mut file: PolicyFile = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::write(d.path().join("K"), "real-value\n").unwrap();
        file.sessions[0].secrets = vec![SecretEntry {
            name: "K".into(),
            placeholder: format!("{}0123", crate::gate::secrets::PREFIX),
            value_file: d.path().join("K"),
            hosts: vec!["api.example.com".into()],
        }];
        std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
        let s = load(&path).unwrap();
        assert!(s[0].secrets.terminates("api.example.com") && s[0].upstream().is_ok());
        let header = format!("Bearer {}0123", crate::gate::secrets::PREFIX);
        assert_eq!(
            s[0].secrets.substitute(header.as_bytes(), "api.example.com"),
            Ok(Some(b"Bearer real-value".to_vec()))
        );
        std::fs::write(d.path().join("K"), "\n").unwrap();
        let e = format!("{:#}", load(&path).err().unwrap());
        assert!(e.contains("empty value"), "{e}");
    }

    #[test]
    fn a_made_ca_loads_and_is_never_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ca");
        make_ca(&dir).unwrap();
        let ca = load_ca(&dir).unwrap();
        assert!(ca.server_config("api.example.com", crate::gate::proto::Proto::H1).is_ok());
        assert_eq!(ca.pem, std::fs::read_to_string(dir.join("ca.pem")).unwrap());
        let e = format!("{:#}", make_ca(&dir).unwrap_err());
        assert!(e.contains("never overwritten"), "{e}");
        // A key that is not the certificate's pair: leaves would not verify; refused at load.
        let other = d.path().join("other");
        make_ca(&other).unwrap();
        std::fs::copy(other.join("ca.key"), dir.join("ca.key")).unwrap();
        assert!(load_ca(&dir).is_err(), "a mismatched key was taken");
    }
}
