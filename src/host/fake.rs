//! A host for tests: answers from fixed data, records every side effect it is asked for as a
//! typed `Effect`, and fails any kind of effect a test names (`fails`), as the launch's fake
//! does for its steps: what a caller does when an effect fails is tested, not assumed.

use super::{Os, Ports};
use crate::plan::protect::Protected;
use crate::plan::{Facts, Plan};
use crate::policy::Policy;
use anyhow::Result;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};

/// One side effect, as `FakeHost` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A file written (`write_file`, `write_trusted`).
    Write(PathBuf),
    /// A directory removed with everything below it.
    Remove(PathBuf),
    /// A lock taken.
    Lock(PathBuf),
    /// A live change (its entries as the allowlist prints them) to the sandbox of `record`.
    LiveAllow { change: String, record: PathBuf },
    /// The forwarded signals blocked, before any thread starts.
    BlockSignals,
    /// The session registered with the gate (whose search starts at `port_from`).
    RegisterGate { port_from: u16 },
    /// A relay bound on the host's loopback at `port`, to `to`.
    Relay { port: u16, to: SocketAddrV4 },
    /// The self-check's listener bound (None: every port tried is allowed).
    Canary(Option<u16>),
    /// A host loopback service asked (`probe_loopback`; it cannot fail).
    Probe(u16),
    /// A plan launched, with its podman argv.
    Launch(Vec<String>),
    /// A command run in a running sandbox (`podman exec` argv).
    Exec(Vec<String>),
    /// A login copied into the private store.
    Copy { from: PathBuf, to: PathBuf },
    /// `podman save IMAGE` made the standard input (`image share`).
    FeedImage(String),
}

/// The kinds of `Effect`, to name in `FakeHost::fails`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Write,
    Remove,
    Lock,
    LiveAllow,
    BlockSignals,
    RegisterGate,
    Relay,
    Canary,
    Probe,
    Launch,
    Exec,
    Copy,
    FeedImage,
}

impl Effect {
    pub fn kind(&self) -> Kind {
        match self {
            Effect::Write(_) => Kind::Write,
            Effect::Remove(_) => Kind::Remove,
            Effect::Lock(_) => Kind::Lock,
            Effect::LiveAllow { .. } => Kind::LiveAllow,
            Effect::BlockSignals => Kind::BlockSignals,
            Effect::RegisterGate { .. } => Kind::RegisterGate,
            Effect::Relay { .. } => Kind::Relay,
            Effect::Canary(_) => Kind::Canary,
            Effect::Probe(_) => Kind::Probe,
            Effect::Launch(_) => Kind::Launch,
            Effect::Exec(_) => Kind::Exec,
            Effect::Copy { .. } => Kind::Copy,
            Effect::FeedImage(_) => Kind::FeedImage,
        }
    }
}

/// A host for tests: answers from fixed data and records what it was asked to do.
#[derive(Debug, Default)]
pub struct FakeHost {
    pub vars: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub files: Vec<(PathBuf, String)>,
    pub uid: u32,
    pub tty: bool,
    pub stdout: String,
    pub stderr: String,
    /// Every side effect requested, in order.
    pub effects: Vec<Effect>,
    /// The kinds of effect that fail (after being recorded), to test what a caller does then.
    pub fails: Vec<Kind>,
    pub exit_code: i32,
    /// Replies of host loopback services, by port.
    pub loopback: Vec<(u16, Vec<u8>)>,
    /// Answers to `confirm`, in order (none left: no).
    pub answers: Vec<bool>,
    /// Programs on PATH that are not in /usr/bin (every other name is).
    pub programs: Vec<(String, crate::plan::agent::Found)>,
    /// The user's git identity (`Host::git_identity`).
    pub git_identity: Option<(String, String)>,
    /// Bytes free where `Host::free_space` is asked (None: unknown).
    pub free: Option<u64>,
    /// Live records of running sandboxes (`live_sessions` returns them all).
    pub live: Vec<PathBuf>,
    /// What `running` returns.
    pub running: Vec<crate::live::Running>,
    /// Images podman does not have (every other name is present).
    pub missing_images: Vec<String>,
    /// The plans it was asked to launch.
    pub launched: Vec<Plan>,
    /// Host loopback ports something else listens on.
    pub taken_ports: Vec<u16>,
    /// Variables set to a value that is not UTF-8 (`env` says None for them).
    pub not_text: Vec<String>,
    /// The port of a running gate (`gate_port`), none by default.
    pub gate_listening: Option<u16>,
}

impl FakeHost {
    /// Records `e`; fails when its kind is in `fails`.
    fn effect(&mut self, e: Effect) -> anyhow::Result<()> {
        let kind = e.kind();
        self.effects.push(e);
        if self.fails.contains(&kind) {
            anyhow::bail!("{kind:?} failed (FakeHost was asked to fail it)");
        }
        Ok(())
    }

    /// A program on PATH at `path` (its own target, no interpreter).
    pub fn install(&mut self, name: &str, path: &str) {
        let p = PathBuf::from(path);
        self.programs
            .push((name.into(), crate::plan::agent::Found { path: p.clone(), target: p, interpreter: None }));
    }
}

impl Os for FakeHost {
    fn env_not_text(&self, key: &str) -> bool {
        self.not_text.iter().any(|k| k == key)
    }
    fn env(&self, key: &str) -> Option<String> {
        self.vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
    fn cwd(&self) -> anyhow::Result<PathBuf> {
        Ok(self.cwd.clone())
    }
    fn exists(&self, path: &Path) -> bool {
        self.files.iter().any(|(p, _)| p.starts_with(path))
            || ["/usr", "/etc", "/opt"].iter().any(|d| path == Path::new(d))
    }
    fn read_file(&self, path: &Path) -> anyhow::Result<Option<String>> {
        Ok(self.files.iter().find(|(p, _)| p == path).map(|(_, t)| t.clone()))
    }
    fn write_file(&mut self, path: &Path, text: &str) -> anyhow::Result<()> {
        self.effect(Effect::Write(path.to_path_buf()))?;
        self.files.retain(|(p, _)| p != path);
        self.files.push((path.to_path_buf(), text.to_string()));
        Ok(())
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
    fn resolver(&self) -> fn(&Path) -> PathBuf {
        Path::to_path_buf
    }
    fn owned_dir(&self, path: &Path) -> bool {
        // The runtime dirs the fake's variables name are this user's.
        self.vars.iter().any(|(k, v)| k == "XDG_RUNTIME_DIR" && Path::new(v) == path)
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        Some(PathBuf::from(match name {
            "nft" => "/usr/sbin/nft".to_string(),
            n => format!("/usr/bin/{n}"),
        }))
    }
    fn current_exe(&self) -> anyhow::Result<PathBuf> {
        Ok(PathBuf::from("/usr/local/bin/ai-sandbox"))
    }
    fn uid(&self) -> u32 {
        self.uid
    }
    fn own_pid(&self) -> u32 {
        4321
    }
    fn stdio_is_tty(&self) -> bool {
        self.tty
    }
    fn can_ask(&self) -> bool {
        self.tty
    }
    fn random_hex(&mut self, n: usize) -> anyhow::Result<String> {
        Ok("ab".repeat(n))
    }
    fn print(&mut self, text: &str) {
        self.stdout += text;
    }
    fn eprint(&mut self, text: &str) {
        self.stderr += text;
    }
    fn executable(&self, path: &Path) -> Option<bool> {
        if self.is_dir(path) {
            return Some(false);
        }
        self.files.iter().find(|(p, _)| p == path).map(|(_, text)| text.starts_with("#!"))
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.files.iter().any(|(p, _)| p != path && p.starts_with(path))
    }
    fn port_taken(&self, port: u16) -> Option<String> {
        self.taken_ports.contains(&port).then(|| "by pid 4242 (python3)".to_string())
    }
    fn list_dir(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = self
            .files
            .iter()
            .filter_map(|(p, _)| p.strip_prefix(dir).ok()?.components().next().map(|c| dir.join(c)))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
    fn remove_tree(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.effect(Effect::Remove(dir.to_path_buf()))?;
        self.files.retain(|(p, _)| !p.starts_with(dir));
        Ok(())
    }
    fn loader(&self, _exe: &Path) -> Option<PathBuf> {
        Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
    }
    fn lock(&mut self, path: &Path) -> anyhow::Result<Box<dyn std::any::Any>> {
        self.effect(Effect::Lock(path.to_path_buf()))?;
        Ok(Box::new(()))
    }
    fn git_identity(&self) -> Option<(String, String)> {
        self.git_identity.clone()
    }
    fn free_space(&self, _: &Path) -> Option<u64> {
        self.free
    }
    fn confirm(&mut self, question: &str) -> anyhow::Result<bool> {
        self.stderr += question;
        Ok(if self.answers.is_empty() { false } else { self.answers.remove(0) })
    }
    fn find_program(&self, name: &str) -> Option<crate::plan::agent::Found> {
        if let Some((_, f)) = self.programs.iter().find(|(n, _)| n == name) {
            return Some(f.clone());
        }
        if name.starts_with("nosuch") {
            return None;
        }
        let p = PathBuf::from(format!("/usr/bin/{name}"));
        Some(crate::plan::agent::Found { path: p.clone(), target: p, interpreter: None })
    }
    fn read_secret_file(&self, path: &Path) -> anyhow::Result<String> {
        self.files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, t)| t.trim_end_matches('\n').to_string())
            .ok_or_else(|| anyhow::anyhow!("reading the secret file {}: not found", path.display()))
    }
}

impl Ports for FakeHost {
    fn block_forwarded_signals(&mut self) -> anyhow::Result<()> {
        self.effect(Effect::BlockSignals)
    }
    fn live_sessions(&self, _runtime: &Path, _project: &Path) -> Vec<PathBuf> {
        self.live.clone()
    }
    fn stdin_from_image(&mut self, _podman: &Path, image: &str) -> anyhow::Result<super::ImageFeed> {
        self.effect(Effect::FeedImage(image.to_string()))?;
        Ok(Box::new(|| Ok(())))
    }
    fn image_present(&self, _podman: &Path, image: &str) -> anyhow::Result<bool> {
        Ok(!self.missing_images.iter().any(|m| m == image))
    }
    fn reviews(&self, _states: &Path) -> Vec<crate::review::Waiting> {
        Vec::new()
    }
    fn running(&self, _runtime: &Path) -> Vec<crate::live::Running> {
        self.running.clone()
    }
    fn gate_sessions(&self, _runtime: &Path) -> Vec<crate::gate::control::SessionStatus> {
        Vec::new()
    }
    fn gate_port(&self, _runtime: &Path) -> Option<u16> {
        self.gate_listening
    }
    fn write_trusted(&mut self, _: &Path, project: &Path, rel: &Path, text: &str) -> Result<()> {
        self.write_file(&project.join(rel), text)
    }
    fn live_allow(
        &mut self,
        _runtime: &Path,
        record: &Path,
        change: &crate::live::Change,
    ) -> anyhow::Result<()> {
        self.effect(Effect::LiveAllow { change: change.summary(), record: record.to_path_buf() })
    }
    fn register_gate(&mut self, policy: &Policy, facts: &Facts) -> anyhow::Result<(u16, Option<String>)> {
        self.effect(Effect::RegisterGate { port_from: policy.gate_port })?;
        let ca = (!facts.bound.is_empty()).then(|| "-----BEGIN CERTIFICATE-----\nFAKE\n".to_string());
        Ok((policy.gate_port + 1, ca))
    }
    fn start_relays(&mut self, targets: &[std::net::SocketAddrV4]) -> anyhow::Result<Vec<u16>> {
        let ports: Vec<u16> = (40000..).take(targets.len()).collect();
        for (to, port) in targets.iter().zip(&ports) {
            self.effect(Effect::Relay { port: *port, to: *to })?;
        }
        Ok(ports)
    }
    fn bind_canary(&mut self, allowed: &dyn Fn(u16) -> bool) -> anyhow::Result<Option<u16>> {
        let port = (45000..45064).find(|p| !allowed(*p));
        self.effect(Effect::Canary(port))?;
        Ok(port)
    }
    fn probe_loopback(&mut self, port: u16, _ask: &[u8]) -> Vec<u8> {
        self.effects.push(Effect::Probe(port));
        self.loopback.iter().find(|(p, _)| *p == port).map(|(_, r)| r.clone()).unwrap_or_default()
    }
    fn exec(&mut self, argv: &[String]) -> anyhow::Result<i32> {
        self.effect(Effect::Exec(argv.to_vec()))?;
        Ok(self.exit_code)
    }
    fn launch(&mut self, plan: &Plan) -> anyhow::Result<i32> {
        self.effect(Effect::Launch(plan.argv.clone()))?;
        self.launched.push(plan.clone());
        Ok(self.exit_code)
    }
    fn copy_private(
        &mut self,
        from: &Path,
        store: &Path,
        rel: &Path,
        fields: Option<&[&str]>,
    ) -> anyhow::Result<()> {
        let to = store.join(rel);
        let text = self.read_file(from)?.ok_or_else(|| anyhow::anyhow!("{} not found", from.display()))?;
        let text = crate::launch::logins::login_part(text.as_bytes(), fields)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .ok_or_else(|| anyhow::anyhow!("{} holds no login", from.display()))?;
        self.effect(Effect::Copy { from: from.to_path_buf(), to: to.clone() })?;
        self.files.push((to.to_path_buf(), text));
        Ok(())
    }
    fn protected_mounts(&self, project: &Path, rels: &[String]) -> Result<Protected> {
        let mounts = rels
            .iter()
            .map(|r| project.join(r))
            .filter(|p| self.files.iter().any(|(f, _)| f.starts_with(p)))
            .collect();
        Ok(crate::plan::protect::Protected { mounts, ..Default::default() })
    }
    fn settle_leftovers(&mut self, _state_dir: &Path) -> Result<()> {
        // A fake holds no guard records: nothing to settle, so no effect (the e2e suite proves
        // the real one runs before the config is read).
        Ok(())
    }
}
