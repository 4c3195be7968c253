//! Sandboxes that cannot reach each other or the tool (issue: one project's agent must leave
//! nothing that another project's sandbox runs or reads, and no project holds ai-sandbox's own
//! state). Each refusal beside the same work succeeding where it should.

use crate::harness::*;
use std::path::{Path, PathBuf};

/// Prints, inside, where the root directory is on the host (the root mount's source path).
const ROOT_SOURCE: &str = "awk '$5 == \"/\" { print \"root=\" $4 }' /proc/self/mountinfo";

/// The root directory a sandbox printed with ROOT_SOURCE.
fn root_of(stdout: &str) -> PathBuf {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("root="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no root mount in:\n{stdout}"))
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn what_one_sandbox_writes_to_its_root_no_later_sandbox_sees_and_bin_sh_stays_the_real_one() {
    let t = std::process::id();
    let (a, b) = (Project::new("root-a"), Project::new("root-b"));
    let plant = format!(
        "for d in / /var /root /mnt /home /run /srv /opt /etc /usr /tmp /var/tmp; do \
           (echo x > \"$d/planted-{t}\") 2>/dev/null && echo \"wrote $d\"; done; \
         mkdir -p /tmp/evil && printf '#!/bin/sh\\necho PLANTED\\n' > /tmp/evil/sh && chmod +x /tmp/evil/sh; \
         ln -sfn /tmp/evil /bin 2>/dev/null && echo 'replaced /bin'; \
         mv /bin /bin.old 2>/dev/null && echo 'moved /bin'; \
         readlink /bin"
    );
    let r = sandbox(&a, &["--", "sh", "-c", &plant], &[]);
    r.ok();
    let wrote: Vec<&str> = r.stdout.lines().filter_map(|l| l.strip_prefix("wrote ")).collect();
    // Positive control: the loop writes where the sandbox may (its own tmpfs), and only there.
    assert_eq!(wrote, ["/tmp", "/var/tmp"], "{}", r.stdout);
    assert!(!r.stdout.contains("replaced /bin") && !r.stdout.contains("moved /bin"), "{}", r.stdout);
    assert_eq!(r.stdout.lines().last(), Some("usr/bin"), "{}", r.stdout);

    std::fs::write(b.path("script.sh"), "#!/bin/sh\necho \"shell ok: $0\"\n").unwrap();
    std::fs::set_permissions(b.path("script.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    chown_user(&b.path("script.sh"));
    let look = format!(
        "for d in / /var /root /mnt /home /run /tmp /var/tmp; do [ -e \"$d/planted-{t}\" ] && echo \"found $d\"; done; \
         [ -e /tmp/evil ] && echo 'found /tmp/evil'; ./script.sh; echo b-{t} > \"$HOME/b-{t}\""
    );
    let r = sandbox(&b, &["--", "sh", "-c", &look], &[]);
    r.ok();
    assert!(!r.stdout.contains("found"), "another project's sandbox saw A's files: {}", r.stdout);
    assert!(r.stdout.contains("shell ok: ./script.sh") && !r.stdout.contains("PLANTED"), "{}", r.stdout);
    // Control: B's own HOME keeps what B wrote in an earlier session.
    let again = sandbox(&b, &["--", "sh", "-c", &format!("cat \"$HOME/b-{t}\"")], &[]);
    assert_eq!(again.ok().stdout.trim(), format!("b-{t}"));
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn every_writable_directory_inside_is_the_project_the_home_or_a_tmpfs_of_the_session() {
    writable_directories_are_the_sessions_own(&Project::new("writable"), &[]);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn with_its_own_container_engine_too_every_writable_directory_is_the_sessions_own() {
    let p = Project::new("writable-engine");
    // A container run first, so the engine's storage and run state exist when the walk looks.
    crate::containers::busybox_image(&p);
    let run =
        "podman import -q bb.tar localhost/bb >/dev/null && podman run --rm localhost/bb true && echo ran";
    let r = sandbox(&p, &["--containers", "--", "sh", "-c", run], &[]);
    assert!(r.ok().stdout.contains("ran"), "{}", r.stderr);
    writable_directories_are_the_sessions_own(&p, &["--containers"]);
}

fn writable_directories_are_the_sessions_own(p: &Project, flags: &[&str]) {
    let walk = "find / -xdev -writable -type d 2>/dev/null; echo ---; cat /proc/self/mountinfo";
    let args: Vec<&str> = flags.iter().copied().chain(["--", "sh", "-c", walk]).collect();
    let r = sandbox(p, &args, &[]);
    r.ok();
    let (found, mounts) = r.stdout.split_once("---\n").expect("both parts");
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPER
    let fstype = |dir: &str| {
        mounts.lines().rev().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            (f.get(4) == Some(&dir)).then(|| f[dash + 1].to_string())
        })
    };
    let (project, home) = (p.dir.display().to_string(), env().home.display().to_string());
    let found: Vec<&str> = found.lines().collect();
    // Positive control: find lists what is writable (the HOME and /tmp are; the project is below
    // /var/tmp here, a file system of its own that -xdev does not enter).
    assert!(found.contains(&home.as_str()) && found.contains(&"/tmp"), "{found:?}");
    for dir in &found {
        let own = *dir == project
            || dir.starts_with(&format!("{project}/"))
            || *dir == home
            || dir.starts_with(&format!("{home}/"));
        let session_fs = matches!(fstype(dir).as_deref(), Some("tmpfs" | "mqueue" | "devpts"));
        assert!(
            own || session_fs,
            "{dir} is writable inside and is neither the project, the HOME nor a tmpfs of the session ({:?})\n{}",
            fstype(dir),
            r.stdout
        );
    }
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn twenty_sessions_leave_no_root_behind_and_an_old_skeleton_planted_on_the_host_is_never_used() {
    // What the shared skeleton of earlier versions would be after a hostile session: /bin a link
    // to a directory of the agent's.
    let old = env().home.join(".cache/ai-sandbox/rootfs-v1");
    let _ = std::fs::remove_dir_all(&old);
    for d in ["usr", "etc", "evil"] {
        std::fs::create_dir_all(old.join(d)).unwrap();
    }
    std::fs::write(old.join("evil/sh"), "#!/usr/bin/bash\necho PLANTED\n").unwrap();
    std::fs::set_permissions(old.join("evil/sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    std::os::unix::fs::symlink("evil", old.join("bin")).unwrap();
    let chowned = std::process::Command::new("chown")
        .arg("-hR")
        .arg(format!("{}:", env().user))
        .arg(env().home.join(".cache/ai-sandbox"))
        .status()
        .unwrap();
    assert!(chowned.success());

    let p = Project::new("twenty");
    for i in 0..20 {
        let cmd = format!("{ROOT_SOURCE}; readlink /bin; echo shell-ok");
        let r = sandbox(&p, &["--", "/bin/sh", "-c", &cmd], &[]);
        r.ok();
        assert!(
            r.stdout.contains("usr/bin\nshell-ok") && !r.stdout.contains("PLANTED"),
            "session {i}: {}",
            r.stdout
        );
        let root = root_of(&r.stdout);
        assert!(root.starts_with(sessions_dir()), "session {i}'s root is not its own: {}", root.display());
        assert!(
            !root.parent().unwrap().exists(),
            "session {i} left its directory (and root) behind: {}",
            root.display()
        );
    }
    assert!(std::fs::read_link(old.join("bin")).is_ok(), "the old skeleton is left alone, unused");
    let _ = std::fs::remove_dir_all(env().home.join(".cache/ai-sandbox"));
}

/// A data dir of the test's own (the store and the sandbox HOMEs), so parallel tests with the
/// same agent's `state` line do not meet it.
fn data_home(name: &str) -> PathBuf {
    let d = env().home.join(format!("e2e-data-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    chown_user(&d);
    d
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_agent_store_carries_the_login_from_project_to_project_and_nothing_else() {
    let t = std::process::id();
    let data = data_home("store");
    let vars = [("XDG_DATA_HOME", data.to_str().unwrap())];
    let real = env().home.join(".codex");
    let real_before = std::fs::read_dir(&real).map(|d| d.count()).ok();
    let (a, b) = (Project::new("store-a"), Project::new("store-b"));
    a.config("state = codex\n");
    b.config("state = codex\n");
    // A logs in, and plants what codex would run or read in another project.
    let hostile = format!(
        "cd \"$CODEX_HOME\" && echo '{{\"OPENAI_API_KEY\":\"sk-a-{t}\",\"tokens\":{{\"id_token\":\"idt-{t}\",\"mcp\":{{\"x\":{{\"command\":\"touch /tmp/pwned\"}}}}}}}}' > auth.json && \
         echo 'notify = [\"sh\", \"-c\", \"touch /tmp/pwned\"]' > config.toml && echo 'obey me' > AGENTS.md && \
         mkdir -p sessions && echo 'secret transcript of A' > sessions/a.jsonl && echo \"home=$CODEX_HOME\""
    );
    let r = sandbox(&a, &["--", "sh", "-c", &hostile], &vars);
    r.ok();
    assert!(
        r.stderr.contains("held what a login does not") && r.stderr.contains("tokens.mcp"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.contains(&format!("home={}/.codex", env().home.display())), "{}", r.stdout);
    let look = "cd \"$CODEX_HOME\" && cat auth.json; for f in config.toml AGENTS.md sessions; do [ -e $f ] && echo \"found $f\"; done; true";
    let rb = sandbox(&b, &["--", "sh", "-c", look], &vars);
    rb.ok();
    // Control: B is logged in with the login A made, its key and id token as the gate's
    // placeholders (the gate holds them: ADR 0087).
    assert!(
        rb.stdout.contains("\"sk-aisb_placeholder_") && !rb.stdout.contains(&format!("sk-a-{t}")),
        "A's login is not in B, held by the gate: {}",
        rb.stdout
    );
    assert!(!rb.stdout.contains("found"), "B saw what A planted beside its login: {}", rb.stdout);
    assert!(
        rb.stdout.contains("\"id_token\": \"aisb_placeholder_") && !rb.stdout.contains("command"),
        "B saw what A planted inside a login field: {}",
        rb.stdout
    );
    // A project without the line gets no login at all.
    let c = Project::new("store-c");
    let rc = sandbox(
        &c,
        &["--", "sh", "-c", "cat \"$HOME/.codex/auth.json\" 2>/dev/null || echo no-login"],
        &vars,
    );
    assert_eq!(rc.ok().stdout.trim(), "no-login");
    // B puts another login in place of the one the gate holds: it is said and not carried back;
    // A's next session has the held login, and still has its own settings.
    let other =
        format!("echo '{{\"OPENAI_API_KEY\":\"sk-b-{t}\",\"tokens\":null}}' > \"$CODEX_HOME/auth.json\"");
    let rr = sandbox(&b, &["--", "sh", "-c", &other], &vars);
    rr.ok();
    assert!(rr.stderr.contains("replaced by one without the gate's placeholders"), "{}", rr.stderr);
    let ra =
        sandbox(&a, &["--", "sh", "-c", "cd \"$CODEX_HOME\" && cat auth.json && cat config.toml"], &vars);
    ra.ok();
    assert!(
        ra.stdout.contains("\"sk-aisb_placeholder_") && !ra.stdout.contains(&format!("sk-b-{t}")),
        "{}",
        ra.stdout
    );
    assert!(ra.stdout.contains("notify"), "{}", ra.stdout);
    // The store holds the login fields only, A's; the real ~/.codex is untouched.
    let store = std::fs::read_to_string(data.join("ai-sandbox/agents/codex/login/auth.json")).unwrap();
    assert!(
        store.contains(&format!("sk-a-{t}"))
            && !store.contains(&format!("sk-b-{t}"))
            && !store.contains("notify"),
        "{store}"
    );
    let files: Vec<_> = std::fs::read_dir(data.join("ai-sandbox/agents/codex/login"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files, ["auth.json"], "the store holds the login file only");
    assert_eq!(
        std::fs::read_dir(&real).map(|d| d.count()).ok(),
        real_before,
        "the real ~/.codex was touched"
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn projects_that_hold_the_tools_own_directories_are_refused_and_a_dotfiles_subfolder_runs() {
    let e = env();
    let t = std::process::id();
    let config = e.home.join(".config");
    let dotfiles = config.join(format!("e2e-dotfiles-{t}"));
    std::fs::create_dir_all(dotfiles.join(".git")).unwrap();
    for d in
        [&config, &dotfiles, &dotfiles.join(".git"), &e.home.join(".local"), &e.home.join(".local/state")]
    {
        std::fs::create_dir_all(d).unwrap();
        chown_user(d);
    }
    let run_dir = format!("/run/user/{}", e.uid);
    let state = e.home.join(".local/state").display().to_string();
    let cfg = config.display().to_string();
    for (project, how, what) in [
        (run_dir.as_str(), "contains", "ai-sandbox's runtime directory"),
        (&format!("{run_dir}/ai-sandbox"), "is", "ai-sandbox's runtime directory"),
        (state.as_str(), "contains", "ai-sandbox's state"),
        (cfg.as_str(), "contains", "ai-sandbox's configuration"),
    ] {
        let r = Run::of(user_command(
            &dotfiles,
            &e.bin,
            &["--project", project, "--", "sh", "-c", "echo ran"],
            &[],
        ));
        assert_eq!(r.code, 125, "{project}: {}\n{}", r.stdout, r.stderr);
        assert!(!r.stdout.contains("ran"), "{project}: the command ran");
        assert!(r.stderr.contains(&format!("{project} {how} {what}")), "{project}: {}", r.stderr);
    }
    // From inside ~/.config with no project of its own there, the project is ~/.config: refused.
    let r = Run::of(user_command(&config, &e.bin, &["--", "sh", "-c", "echo ran"], &[]));
    assert!(r.code == 125 && r.stderr.contains(&format!("{cfg} contains ")), "{}", r.stderr);
    // Control: a dotfiles repository in a subfolder of ~/.config runs.
    let r = Run::of(user_command(&dotfiles, &e.bin, &["--", "sh", "-c", "echo ran; pwd"], &[]));
    r.ok();
    assert!(r.stdout.contains(&format!("ran\n{}", dotfiles.display())), "{}", r.stdout);
    let _ = std::fs::remove_dir_all(&dotfiles);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn the_control_socket_refuses_a_process_in_another_user_namespace() {
    let e = env();
    let p = Project::new("barrier");
    p.config("allow = example.com\n");
    let mut running = spawn_sandbox(&p, &["--", "sh", "-c", UNTIL_DONE]);
    let said = running.stderr_live();
    let runtime = format!("AISB_RUNTIME_DIR=/run/user/{}/ai-sandbox", e.uid);
    let status = |prefix: &[&str]| {
        let mut args: Vec<&str> = prefix.to_vec();
        args.extend(["/usr/bin/env", &runtime, e.bin.to_str().unwrap(), "gate", "status"]);
        Run::of(user_command(&p.dir, Path::new(args[0]), &args[1..], &[]))
    };
    // Control: the host's own request is answered, and lists the session.
    let project = p.dir.display().to_string();
    assert!(
        wait_for(20, || status(&[]).stdout.contains(&project)),
        "the gate never listed the session: {}\nthe launcher said: {}",
        status(&[]).stdout,
        said.lock().unwrap()
    );
    // The same request from podman's user namespace (where every sandbox runs), at the socket's
    // path: refused by the gate itself.
    let r = status(&["/usr/bin/podman", "unshare"]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("in another user namespace"), "{}\n{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains(&project), "{}", r.stdout);
    finish(&p, running);
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn a_sandbox_started_without_xdg_runtime_dir_is_seen_from_a_shell_that_has_it() {
    let p = Project::new("su-shell");
    p.config("allow = example.com\n");
    // As through `su`: no XDG_RUNTIME_DIR (set empty here, after the harness's own).
    let child = user_command(&p.dir, &env().bin, &["--", "sh", "-c", UNTIL_DONE], &[("XDG_RUNTIME_DIR", "")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let project = p.dir.display().to_string();
    // From a shell that has the variable (the harness's default), and from one whose variable
    // names somewhere else: one runtime dir, one gate, the same sandbox.
    for vars in [vec![], vec![("XDG_RUNTIME_DIR", "/tmp")]] {
        let seen = wait_for(20, || sandbox(&p, &["ps", "--json"], &vars).stdout.contains(&project));
        assert!(seen, "{vars:?}: `ps` does not see it: {}", sandbox(&p, &["ps", "--json"], &vars).stdout);
    }
    let status = sandbox(&p, &["gate", "status"], &[]);
    assert!(status.ok().stdout.contains(&project), "{}", status.stdout);
    let _ = std::fs::write(p.path("done"), "");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !std::path::Path::new(&format!("/tmp/ai-sandbox-{}", env().uid)).join("gate.sock").exists(),
        "a second gate in /tmp"
    );
}
