//! Policy + host facts → the `podman run` argument vector.
//!
//! Option order matters to podman: global options (`--hooks-dir`) before `run`; run options;
//! the user's extra arguments after ours (so they are visible last, but the guarded ones were
//! refused in `policy`); then the image, or `--rootfs DIR` for `image = host`, which podman
//! takes as the positional image argument; then the command.

use crate::plan::session::{self, Facts};
use crate::policy::{Command, Image, NetMode, Policy};
use std::ffi::OsString;
use std::path::PathBuf;

/// The gate as the sandbox reaches it: on its own loopback, where pasta forwards the gate's port
/// to the host's loopback on the spliced path (`-T`). Through `gate_addr` every byte the sandbox
/// sends crawls through pasta's tap path (measured: 0.04 Gbit/s against 11 spliced).
const GATE_HOST: &str = "127.0.0.1";

/// Where this binary is mounted inside (read-only) when the gate is in use: ssh's ProxyCommand.
pub(crate) const CONNECT_EXE: &str = "/run/ai-sandbox/ai-sandbox";
/// Where the directory of this program's loader (the host's) is mounted inside, read-only, so
/// the self-check runs inside any image (see `plan::check_hook`).
pub(crate) const HOST_LIB_DIR: &str = "/run/ai-sandbox/lib";
/// The system ssh client config, replaced inside for `image = host` (see `ssh_config`).
pub(crate) const SSH_CONFIG: &str = "/etc/ssh/ssh_config";

/// The sandbox's /etc/ssh/ssh_config for `image = host`: the host's file, and the files it
/// includes, belong to the host's root, which the sandbox does not map, and ssh refuses to read
/// them ("Bad owner or permissions"), so plain `ssh`, `scp`, `rsync -e ssh` and git over ssh
/// would not run at all. With the gate in use, every host goes through it (ssh's ProxyCommand),
/// so an allowed `HOST:22` works with no flags.
pub(crate) fn ssh_config(p: &Policy, f: &Facts) -> Option<String> {
    if p.image != Image::Host || !f.host_ssh_config || p.net == NetMode::None {
        return None;
    }
    let mut text = String::from(
        "# Written by ai-sandbox for this sandbox in place of the host's /etc/ssh/ssh_config, which\n\
         # belongs to a user the sandbox does not map (ssh refuses such files).\n",
    );
    if p.gate {
        text += &format!("Host *\n    ProxyCommand {CONNECT_EXE} connect %h %p\n");
    }
    Some(text)
}

/// Where `--ssh-agent` mounts the user's agent socket inside (SSH_AUTH_SOCK points there).
pub(crate) const SSH_AGENT_SOCK: &str = "/run/ai-sandbox/ssh-agent.sock";

/// Variables that point clients at the gate (see `Facts::gate_env`), and git over SSH
/// (`ai-sandbox connect` as ssh's ProxyCommand) unless the user set it.
fn gate_env(p: &Policy, f: &Facts) -> Vec<(String, String)> {
    if !p.gate {
        return Vec::new();
    }
    let mut v = f.gate_env(GATE_HOST, &p.no_proxy.join(","));
    // `-F none`: inside, the host's /etc/ssh files belong to an unmapped root, and ssh refuses
    // config files with such an owner (it would not run at all).
    if !p.user_sets("GIT_SSH_COMMAND") {
        v.push((
            "GIT_SSH_COMMAND".into(),
            format!("ssh -F none -o ProxyCommand='{CONNECT_EXE} connect %h %p'"),
        ));
    }
    v
}

/// The PATH a command is looked up in inside (podman's default for a rootfs without an image
/// config), unless the user sets one.
pub(crate) const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The resource flags rootless podman ignores on cgroup v1 (and warns about on every run).
const CGROUP_V2_ONLY: &[&str] =
    &["--memory", "--memory-swap", "--memory-reservation", "--cpus", "--cpu-shares", "--pids-limit"];

/// `extra_args` as podman gets them: on a cgroup v1 host, the limits podman would ignore (with
/// its warning) are left out, and the plan says so (`ignored_extra_args`).
fn extra_args(p: &Policy, f: &Facts) -> Vec<String> {
    let (kept, _) = split_cgroup_v2_only(&p.extra_args, f.cgroup_v2);
    kept
}

/// `args` without the cgroup-v2-only limits when `cgroup_v2` is false, and those left out.
pub(crate) fn split_cgroup_v2_only(args: &[String], cgroup_v2: bool) -> (Vec<String>, Vec<String>) {
    if cgroup_v2 {
        return (args.to_vec(), Vec::new());
    }
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        // `--memory=1g`, `-m1g`: the value in the word; `--memory 1g`, `-m 1g`: the next word.
        let (name, in_word) = a.split_once('=').map_or((a.as_str(), false), |(n, _)| (n, true));
        let short_in_word = a.len() > 2 && a.starts_with("-m") && !a.starts_with("--");
        if CGROUP_V2_ONLY.contains(&name) || name == "-m" || short_in_word {
            dropped.push(a.clone());
            if !in_word
                && !short_in_word
                && let Some(v) = args.get(i + 1)
            {
                dropped.push(v.clone());
                i += 1;
            }
        } else {
            kept.push(a.clone());
        }
        i += 1;
    }
    (kept, dropped)
}

/// The sandbox's PATH (`image = host`), unless the user set PATH themselves: the agent's
/// interpreter first (nvm's node, say), and the sandbox HOME's `~/.local/bin` last (where
/// `pip install --user` and pipx put programs; last, so it never shadows the host's tools). An
/// image keeps its own PATH, but for the interpreter.
fn interpreter_path(p: &Policy, f: &Facts) -> Option<(String, String)> {
    if p.user_sets("PATH") {
        return None;
    }
    let prefix = f.launchable.path_prefix.as_ref().map(|d| format!("{}:", d.display()));
    match p.image {
        Image::Host => Some((
            "PATH".into(),
            format!("{}{SANDBOX_PATH}:{}/.local/bin", prefix.unwrap_or_default(), f.home.display()),
        )),
        Image::Named(_) => prefix.map(|pre| ("PATH".into(), format!("{pre}{SANDBOX_PATH}"))),
    }
}

/// The variables that point known agents at their shared state (unless the user set them).
fn state_vars(p: &Policy, f: &Facts) -> Vec<(String, String)> {
    p.agent_state
        .iter()
        .filter_map(|s| s.var.as_ref())
        .filter(|(k, _)| !p.user_sets(k))
        .map(|(k, rel)| (k.to_string(), format!("{}/{rel}", f.home.display())))
        .collect()
}

/// Who commits made inside are authored by (`git_identity`): git's author and committer
/// variables, each unless the user set it. Variables, not a file in the sandbox HOME: nothing of
/// the host's git config but the two values crosses, and the agent's own config there stays its.
fn git_identity(p: &Policy, f: &Facts) -> Vec<(String, String)> {
    let Some((name, email)) = &f.git_identity else { return Vec::new() };
    [
        ("GIT_AUTHOR_NAME", name),
        ("GIT_AUTHOR_EMAIL", email),
        ("GIT_COMMITTER_NAME", name),
        ("GIT_COMMITTER_EMAIL", email),
    ]
    .into_iter()
    .filter(|(k, _)| !p.user_sets(k))
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect()
}

/// The env file's text: one `NAME=VALUE` per line, as podman's `--env-file` reads it. Every
/// value ai-sandbox passes goes here (mode 0600, in the private session dir), never on podman's
/// command line, where any local user could read it: the gate token, `env` values, secrets.
pub(crate) fn env_file(p: &Policy, f: &Facts) -> Option<String> {
    let all: Vec<(String, String)> = gate_env(p, f)
        .into_iter()
        .chain(p.env.iter().cloned())
        .chain(f.secrets.iter().cloned())
        .chain(super::gate_ca::env(p, f))
        .chain(interpreter_path(p, f))
        .chain(state_vars(p, f))
        .chain(git_identity(p, f))
        .chain(super::engine::env(p, f))
        .chain(f.ssh_agent.as_ref().map(|_| ("SSH_AUTH_SOCK".to_string(), SSH_AGENT_SOCK.to_string())))
        .collect();
    (!all.is_empty()).then(|| all.iter().map(|(k, v)| format!("{k}={v}\n")).collect())
}

/// pasta's options: the host's loopback as `gate_addr`, and spliced forwards (`-T NS:HOST`,
/// one per option: podman splits pasta's options at commas) for the gate's port and the
/// spliced destinations (see `splice`): a host port's forward goes to that port, an IP entry's
/// to the launcher's relay for it (`<relay>` in a dry run, whose relays are not bound).
fn network_arg(p: &Policy, f: &Facts) -> String {
    match p.net {
        NetMode::Allow => {
            let mut opts = vec!["--map-host-loopback".to_string(), p.gate_addr.to_string()];
            if f.offline {
                // pasta's own addresses for a host with no interface (its "local mode"), given
                // explicitly: with an address and no default route it would copy the address and
                // no route, and the gate's address would be unreachable (docs/adr/0073).
                opts.extend(LOCAL_MODE.iter().map(|s| s.to_string()));
            }
            if p.gate {
                opts.extend(["-T".to_string(), f.gate_port.to_string()]);
            }
            for s in &p.splices {
                let relay = || f.relays.iter().find(|(to, _)| *to == s.to).map(|(_, port)| *port);
                let host = match s.relayed {
                    false => s.to.port().to_string(),
                    true => relay().map_or_else(|| "<relay>".to_string(), |port| port.to_string()),
                };
                opts.extend(["-T".to_string(), format!("{}:{host}", s.ns)]);
            }
            format!("pasta:{}", opts.join(","))
        }
        NetMode::None => "none".into(),
        NetMode::Full => "pasta".into(),
    }
}

/// The sandbox's IPv4 address, netmask and gateway on a host with no default route: the link-local
/// ones pasta assigns when the host has no interface at all.
pub(crate) const LOCAL_MODE: &[&str] = &["-a", "169.254.2.1", "-n", "30", "-g", "169.254.2.2"];

/// Whether `/proc/net/route`'s text has no default route (destination and mask 0); false when
/// there is no text to tell (the file was not read), so that nothing changes then.
pub(crate) fn offline(route: Option<&str>) -> bool {
    let Some(text) = route else { return false };
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let default = rows.iter().any(|f| f.get(1) == Some(&"00000000") && f.get(7) == Some(&"00000000"));
    !default
}

/// Where hosts keep catatonit, podman's init (Debian and Ubuntu, Fedora, others). With
/// `image = host` the sandbox's /usr is the host's, so the same path runs inside, as pid 1 with
/// `-g`: a signal the launcher forwards (SIGINT, SIGTERM, SIGHUP) reaches the command's whole
/// process group, so `sh -c 'grep … | head'` stops on SIGINT outside a terminal as in one.
/// podman's `--init` runs it without `-g` (only the command's first process gets the signal);
/// it is kept for named images, whose entrypoint podman composes with it.
pub(crate) const CATATONIT: &[&str] =
    &["/usr/libexec/podman/catatonit", "/usr/libexec/catatonit/catatonit", "/usr/bin/catatonit"];

/// The whole vector: podman's options, then the command.
pub(crate) fn argv(p: &Policy, f: &Facts) -> Vec<String> {
    let mut a = options(p, f);
    if let Some(init) = &f.init {
        a.extend([init.display().to_string(), "-g".into(), "--".into()]);
    }
    // `containers = on`: `ai-sandbox engine --` opens the engine's socket, starts its API service
    // on it and runs the command (see `launch::engine`).
    if p.containers {
        a.extend([CONNECT_EXE.to_string(), "engine".into(), "--".into()]);
    }
    match &p.command {
        Command::Argv(argv) => {
            let mut argv = argv.clone();
            if let Some(program) = &f.launchable.program {
                argv[0] = program.into();
            }
            a.extend(command_words(&argv));
        }
        Command::Shell if p.image == Image::Host => a.push("/bin/bash".into()),
        Command::Shell => a.push("/bin/sh".into()),
    }
    a
}

/// The command as podman can carry it. Arguments are bytes, but podman writes them into the
/// container's config.json, and JSON strings are text: a byte that is not UTF-8 arrives as
/// U+FFFD (measured: `cat $'caf\xe9.txt'` looked for `caf\xef\xbf\xbd.txt`). Such a command
/// goes through `/bin/sh -c`, whose script (text) makes each argument from `printf` octal
/// escapes and then `exec`s it: same program, same bytes, same process.
fn command_words(argv: &[OsString]) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    if let Some(text) = argv.iter().map(|a| a.to_str().map(String::from)).collect::<Option<Vec<_>>>() {
        return text;
    }
    let mut script = String::new();
    for (i, arg) in argv.iter().enumerate() {
        // `$(...)` drops trailing newlines: a final `_` keeps them, and is removed after.
        let mut fmt = String::new();
        for &b in arg.as_bytes() {
            match b {
                b'%' => fmt += "%%",
                0x20..=0x7e if b != b'\\' && b != b'\'' => fmt.push(b as char),
                _ => fmt += &format!("\\{b:03o}"),
            }
        }
        script += &format!("a{i}=$(printf '{fmt}_'); a{i}=${{a{i}%_}}; ");
    }
    let names: Vec<String> = (0..argv.len()).map(|i| format!("\"$a{i}\"")).collect();
    script += &format!("exec {}", names.join(" "));
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// A bind mount as podman takes it: `-v SRC:DST[:ro]`, or, when a path holds a `:` (where `-v`
/// splits) or a `,`, `--mount type=bind,src=…,dst=…[,ro]` with each field quoted as CSV, which
/// is how podman reads `--mount` (measured: a project at `/p/a:b,c` mounts and runs).
pub(crate) fn bind(src: &std::path::Path, dst: &std::path::Path, ro: bool) -> [String; 2] {
    let (s, d) = (src.display().to_string(), dst.display().to_string());
    if !s.contains([':', ',']) && !d.contains([':', ',']) {
        return ["-v".into(), format!("{s}:{d}{}", if ro { ":ro" } else { "" })];
    }
    let field = |k: &str, v: &str| {
        let f = format!("{k}={v}");
        match f.contains([',', '"']) {
            true => format!("\"{}\"", f.replace('"', "\"\"")),
            false => f,
        }
    };
    let mut fields = vec!["type=bind".to_string(), field("src", &s), field("dst", &d)];
    if ro {
        fields.push("ro".into());
    }
    ["--mount".into(), fields.join(",")]
}

/// podman, its options, and the image (or `--rootfs DIR`): everything before the command.
fn options(p: &Policy, f: &Facts) -> Vec<String> {
    let mut a: Vec<String> = vec![f.podman.display().to_string()];
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    if p.net == NetMode::Allow {
        push(&["--hooks-dir", &f.hooks_dir().display().to_string()]);
    }
    push(&["run", "--rm", "-i"]);
    if f.tty {
        push(&["-t"]);
    }
    let project = p.project.display().to_string();
    let home = f.home.display().to_string();
    if f.init.is_none() {
        push(&["--init"]);
    }
    push(&[
        // The shell's prompt says where it is (`user@ai-sandbox`), not a container id.
        "--hostname",
        "ai-sandbox",
        "--name",
        &f.container_name(),
        "--pidfile",
        &f.session_dir.join(session::CONTAINER_PID_FILE).display().to_string(),
        "--label",
        &format!("{}={}", session::SESSION_LABEL, f.session_id),
        "--label",
        &format!("{}={}", session::SESSION_DIR_LABEL, f.session_dir.display()),
        "--label",
        &format!("{}={project}", session::PROJECT_LABEL),
        "--network",
        &network_arg(p, f),
        "--http-proxy=false",
        "--userns",
        "keep-id",
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "all",
        "--workdir",
        &f.workdir.display().to_string(),
    ]);
    a.extend(super::engine::options(p, f));
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    if p.net == NetMode::Allow {
        // crun says only a failed hook's exit code; this is where it writes the hook's reason
        // (runc ignores the annotation and says the reason itself).
        let file = f.session_dir.join(session::HOOKS_STDERR_FILE);
        push(&["--annotation", &format!("run.oci.hooks.stderr={}", file.display())]);
    }
    match p.workspace {
        // The project as the lower layer of an overlay: everything the sandbox writes lands in
        // the session's upper layer, never in the project (podman's `:O`; see `review`).
        crate::policy::Workspace::Review => {
            let dir = f.review_dir();
            let upper = dir.join(crate::contract::review::UPPER_DIR);
            let work = dir.join(crate::contract::review::WORK_DIR);
            push(&[
                "-v",
                &format!("{project}:{project}:O,upperdir={},workdir={}", upper.display(), work.display()),
            ]);
        }
        crate::policy::Workspace::Direct => {
            let [flag, value] = bind(&p.project, &p.project, false);
            push(&[&flag, &value]);
        }
    }
    // What the sandbox may take of the machine (see `policy::limits`): the cgroup's pids limit
    // where rootless podman has one (v2, the controller delegated), else nproc, which is the
    // only limit there but counts other processes of the user too under a runtime that sets it
    // before the user namespace (ADR 0081).
    let l = &p.limits;
    if f.pids_cgroup {
        push(&["--pids-limit", &l.pids.to_string()]);
    } else {
        push(&["--ulimit", &format!("nproc={0}:{0}", l.pids)]);
    }
    if let (true, Some(m)) = (f.cgroup_v2, l.memory) {
        push(&["--memory", &m.to_string()]);
    }
    // (host path, path inside, read-only), in podman's order.
    let mut mounts: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    // This binary: the self-check hook, and `ai-sandbox connect` (ssh through the gate); with
    // its loader's directory, so it runs inside any image.
    if p.net == NetMode::Allow || p.containers {
        mounts.push((f.self_exe.clone(), PathBuf::from(CONNECT_EXE), true));
    }
    if p.net == NetMode::Allow {
        if let Some(dir) = f.loader.as_ref().and_then(|l| l.parent()) {
            mounts.push((dir.to_path_buf(), PathBuf::from(HOST_LIB_DIR), true));
        }
        if f.probe != crate::plan::session::Probe::Skipped {
            mounts.push((f.check_exe_target(), f.check_exe(), true));
        }
    }
    if ssh_config(p, f).is_some() {
        mounts.push((f.ssh_config_file(), PathBuf::from(SSH_CONFIG), true));
    }
    if let Some(sock) = &f.ssh_agent {
        mounts.push((sock.clone(), PathBuf::from(SSH_AGENT_SOCK), false));
    }
    mounts.extend(super::gate_ca::mounts(p, f).into_iter().map(|(from, to)| (from, to, true)));
    mounts.extend(super::engine::mounts(p, f).into_iter().map(|(from, to)| (from, to, true)));
    // Read-only at the same path: the agent's install tree (see `agent`), and the paths the host
    // trusts (see `guard`; podman mounts deeper paths last).
    for m in f.launchable.mounts.iter().chain(&f.protected.mounts) {
        mounts.push((m.clone(), m.clone(), true));
    }
    if p.image == Image::Host {
        mounts.extend(f.host_dirs.iter().map(|d| (d.clone(), d.clone(), true)));
    }
    for (from, to, ro) in mounts {
        let [flag, value] = bind(&from, &to, ro);
        push(&[&flag, &value]);
    }
    if p.image == Image::Host {
        // The root is this session's skeleton, read-only (see `root`); what programs expect to
        // write is the session's tmpfs (podman adds its own for /run and /dev).
        push(&["--read-only"]);
        for dir in ["/tmp", "/var/tmp"] {
            push(&["--tmpfs", &format!("{dir}:rw,exec,nosuid,nodev,mode=1777,size={}", p.limits.tmp)]);
        }
    }
    let [flag, value] = bind(&f.sandbox_home, &f.home, false);
    push(&[&flag, &value, "--env", &format!("HOME={home}")]);
    for publ in &p.publish {
        push(&["-p", &format!("127.0.0.1:{}:{}", publ.host, publ.container)]);
    }
    // The proxy variables carry the session token: they go in a 0600 file in the private
    // session dir, never on the command line (any local user can read /proc/PID/cmdline).
    if env_file(p, f).is_some() {
        push(&["--env-file", &f.env_file().display().to_string()]);
    }
    // An image that is not on this machine is an error, never a pull: a pull reaches a registry
    // outside any policy (and the launcher checks first, to say so plainly).
    if matches!(p.image, Image::Named(_)) {
        push(&["--pull=never"]);
    }
    a.extend(extra_args(p, f));
    match &p.image {
        Image::Host => a.extend(["--rootfs".to_string(), f.root_dir().display().to_string()]),
        Image::Named(n) => a.push(n.clone()),
    }
    a
}

#[cfg(test)]
mod cgroup_tests {
    use super::split_cgroup_v2_only;

    #[test]
    fn limits_podman_ignores_on_cgroup_v1_are_left_out_there_and_kept_on_v2() {
        let args: Vec<String> =
            ["-v", "/d:/d:ro", "--memory", "1g", "--cpus=2", "-m512m", "-m", "2g", "-e", "A=1"]
                .map(String::from)
                .to_vec();
        let (kept, dropped) = split_cgroup_v2_only(&args, false);
        assert_eq!(kept, ["-v", "/d:/d:ro", "-e", "A=1"]);
        assert_eq!(dropped, ["--memory", "1g", "--cpus=2", "-m512m", "-m", "2g"]);
        assert_eq!(split_cgroup_v2_only(&args, true), (args.clone(), Vec::new()));
    }
}
