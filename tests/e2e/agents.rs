//! An agent installed per user runs in the sandbox: its install tree is mounted read-only at the
//! same path (never the real HOME, whose files stay invisible), and a script's interpreter from
//! a version manager comes along. Layouts as Claude Code's native installer and nvm make them.

use crate::harness::*;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

fn write_exec(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn chown_tree(p: &Path) {
    let _ = std::process::Command::new("chown").args(["-R", &env().user]).arg(p).status();
}

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn agents_installed_per_user_run_and_the_real_home_stays_hidden() {
    let home = env().home.clone();
    let tag = std::process::id();
    let native = home.join(format!(".local/share/fakeagent-{tag}/versions/1.0/fakeagent"));
    write_exec(
        &native,
        "#!/bin/sh\necho \"fakeagent ran\"; cat \"$HOME/host-secret-e2e\" 2>/dev/null || echo no-host-secret\n",
    );
    let bin = home.join(".local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let link = bin.join(format!("fakeagent-{tag}"));
    let _ = std::fs::remove_file(&link);
    symlink(&native, &link).unwrap();
    let nvm = home.join(format!(".fakenvm-{tag}/versions/v1"));
    std::fs::create_dir_all(nvm.join("bin")).unwrap();
    std::fs::copy("/usr/bin/dash", nvm.join("bin/fakenode")).unwrap();
    write_exec(
        &nvm.join("lib/node_modules/fakecli/bin/cli.js"),
        "#!/usr/bin/env fakenode\necho fakecli-ran-under-its-own-runtime\n",
    );
    symlink("../lib/node_modules/fakecli/bin/cli.js", nvm.join(format!("bin/fakecli-{tag}"))).unwrap();
    std::fs::write(home.join("host-secret-e2e"), "HOST-SECRET\n").unwrap();
    for p in [home.join(".local"), home.join(format!(".fakenvm-{tag}")), home.join("host-secret-e2e")] {
        chown_tree(&p);
    }
    let path = format!(
        "{}:{}:{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin",
        bin.display(),
        nvm.join("bin").display(),
        env().root.join("bin").display()
    );
    let vars = [("PATH", path.as_str())];
    let p = Project::new("agents");
    let (agent, cli) = (format!("fakeagent-{tag}"), format!("fakecli-{tag}"));

    let r = sandbox(&p, &["--", &agent], &vars);
    let r2 = sandbox(&p, &["--", &cli], &vars);
    let dry = sandbox(&p, &["--dry-run", "--", &cli], &vars);
    let missing = sandbox(&p, &["--", "nosuch-agent-e2e"], &vars);
    let _ = std::fs::remove_dir_all(native.parent().unwrap().parent().unwrap().parent().unwrap());
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_dir_all(home.join(format!(".fakenvm-{tag}")));
    let _ = std::fs::remove_file(home.join("host-secret-e2e"));

    r.ok();
    assert!(
        r.stdout.contains("fakeagent ran"),
        "positive control: the per-user install runs: {}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(
        r.stdout.contains("no-host-secret") && !r.stdout.contains("HOST-SECRET"),
        "the real HOME leaked: {}",
        r.stdout
    );
    assert!(r.stderr.contains("mounted read-only inside"), "the mount is said: {}", r.stderr);
    r2.ok();
    assert!(r2.stdout.contains("fakecli-ran-under-its-own-runtime"), "{}\n{}", r2.stdout, r2.stderr);
    let nvm_s = nvm.display().to_string();
    assert!(
        dry.ok().stdout.contains(&format!("{nvm_s}:{nvm_s}:ro")),
        "dry run shows the mount: {}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains(&format!("PATH={nvm_s}/bin:")),
        "the interpreter's dir leads PATH: {}",
        dry.stdout
    );
    assert_ne!(missing.code, 0);
    assert!(missing.stderr.contains("`nosuch-agent-e2e` is not on this host's PATH"), "{}", missing.stderr);
}
