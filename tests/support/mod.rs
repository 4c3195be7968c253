//! What the plan and export snapshot tests share: the founding example config and a FakeHost
//! with a project whose config is approved.

use ai_sandbox::host::FakeHost;
use std::path::PathBuf;

/// The project's founding example config, every kind of line (not every test file uses it).
#[allow(dead_code)]
pub const DESIGN_CONFIG: &str = "\
# comment
allow = github.com            # hostname: enforced by the gate (ports 80, 443, 8443)
allow = *.npmjs.org           # suffix wildcard
allow = 100.64.0.1:5432       # IP[:port] / CIDR: a direct netfilter rule
env = DATABASE_URL=postgresql://dev@100.64.0.1:5432/app_dev
env = NO_PROXY=100.64.0.1,localhost,127.0.0.1,::1
extra_args = -v /data:/data:ro
gate_addr = 100.64.0.1        # default
gate_port = 18081             # first free port at or above
";

pub fn host(config: &str, vars: &[(&str, &str)]) -> FakeHost {
    let mut h = FakeHost { cwd: PathBuf::from("/home/dev/app"), uid: 1000, ..FakeHost::default() };
    h.vars.push(("HOME".into(), "/home/dev".into()));
    h.vars.push(("XDG_RUNTIME_DIR".into(), "/run/user/1000".into()));
    h.vars.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    h.files.push(("/home/dev/app/.ai-sandbox/config".into(), config.into()));
    // Approved through the real command, as a user would; the record of it is not under test here.
    ai_sandbox::cli::setup::trust_cmd(&mut h, None, false).unwrap();
    h.stdout.clear();
    h.effects.clear();
    h
}
