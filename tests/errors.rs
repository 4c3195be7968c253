//! The errors a newcomer meets, each through the real binary with the message it now gives:
//! what failed, where, and what to write instead. Nothing starts on any of them (dry runs, so
//! nothing could start anyway; the exit status and the absence of a plan on stdout say so).

use std::path::Path;
use std::process::{Command, Output};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_in(dir: &Path, home: &Path, args: &[&str]) -> Out {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A project with this config (None: no config at all) and a separate HOME.
fn project(config: Option<&str>) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let dir = tmp.path().join("proj");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(dir.join(".git")).unwrap();
    if let Some(text) = config {
        std::fs::create_dir_all(dir.join(".ai-sandbox")).unwrap();
        std::fs::write(dir.join(".ai-sandbox/config"), text).unwrap();
    }
    (tmp, dir, home)
}

/// Runs a dry run; requires a refusal whose stderr contains every `want`.
fn refused(config: Option<&str>, args: &[&str], want: &[&str]) -> String {
    let (_t, dir, home) = project(config);
    let mut all = vec!["--dry-run"];
    all.extend_from_slice(args);
    let o = run_in(&dir, &home, &all);
    assert_ne!(o.code, 0, "{config:?} {args:?} was accepted:\n{}", o.stdout);
    assert!(o.stdout.is_empty(), "{config:?} {args:?}: something was planned:\n{}", o.stdout);
    for w in want {
        assert!(o.stderr.contains(w), "{config:?} {args:?}: expected {w:?} in:\n{}", o.stderr);
    }
    o.stderr
}

#[test]
fn port_mistakes_say_what_is_wrong_with_the_port() {
    refused(
        Some("allow = 100.64.0.1:-1\n"),
        &[],
        &[".ai-sandbox/config:1: bad allow entry: `100.64.0.1:-1`: ports cannot be negative (`-1`)"],
    );
    refused(None, &["--publish", "80:"], &["--publish: bad publish `80:`: the port is missing"]);
    let e =
        refused(None, &["--publish", "0"], &["--publish: bad publish `0`: port 0 is out of range (1-65535)"]);
    assert_eq!(e.matches("out of range").count(), 1, "said once: {e}");
    let e = refused(None, &["--publish", "-1"], &["--publish: bad publish `-1`: ports cannot be negative"]);
    assert!(!e.contains("-- -1"), "no advice to write `-- -1`: {e}");
    refused(None, &["--allow", "-5"], &["--allow: bad allow entry"]);
}

#[test]
fn shapes_from_other_formats_get_the_spelling_that_works() {
    refused(
        Some("allow = \"github.com\"\n"),
        &[],
        &["config:1: the value of `allow` is in quotes", "`allow = github.com`"],
    );
    refused(Some("image = 'host'\n"), &[], &["`image = host`"]);
    refused(
        Some("allow = a.com,b.com\n"),
        &[],
        &["lists several entries", "`allow = a.com`, `allow = b.com`"],
    );
    refused(Some("allow = github.com#comment\n"), &[], &["a comment needs whitespace before `#`"]);
    refused(
        Some("[sandbox]\nallow = a.com\n"),
        &[],
        &["config:1: `[sandbox]` looks like a TOML/INI section header"],
    );
    refused(
        Some("allow = [\"a.com\", \"b.com\"]\n"),
        &[],
        &["TOML-style list", "`allow = a.com`, `allow = b.com`"],
    );
    refused(Some("allow: github.com\n"), &[], &["write `allow = github.com` (with `=`, not `:`)"]);
}

#[test]
fn a_huge_line_or_value_is_not_echoed_back() {
    let huge = "a".repeat(2 << 20);
    let e = refused(
        Some(&format!("allow = {huge}\n")),
        &[],
        &["config:1: the line is 2097160 bytes long (at most 8192)"],
    );
    assert!(e.len() < 1000, "{} bytes of error", e.len());
    // One argv string is capped at 128 KiB by the kernel: 100 KB for the flag.
    let long = "a".repeat(100_000);
    let e =
        refused(None, &["--allow", &format!("{long}!")], &["--allow: bad allow entry", "[100001 bytes]`"]);
    assert!(e.len() < 1000, "{} bytes of error for a 100 KB flag", e.len());
}

#[test]
fn a_command_without_double_dash_gets_the_hint() {
    let (_t, dir, home) = project(None);
    let o = run_in(&dir, &home, &["npm", "test"]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("hint: to run a command in the sandbox, put it after `--`: ai-sandbox -- npm test"),
        "{}",
        o.stderr
    );
    // Positive control: with `--`, it plans.
    let o = run_in(&dir, &home, &["--dry-run", "--", "npm", "test"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn images_and_commands_are_checked_before_podman_sees_them() {
    refused(Some("image = ../../etc\n"), &[], &["config:1: `../../etc` is not an image reference"]);
    refused(None, &["--image", ""], &["--image: the image name is empty"]);
    refused(Some("image = -v\n"), &[], &["not an image reference"]);
    refused(Some("image = Ubuntu\n"), &[], &["lowercase"]);
    refused(Some("cmd = \"\"\n"), &[], &["config:1: `cmd` names no program"]);
    refused(None, &["--", ""], &["the command after `--` is an empty string"]);
    // Positive controls: real references plan.
    for ok in [
        "localhost/dev:latest",
        "docker.io/library/alpine:3.20",
        "registry:5000/team/img@sha256:0123456789abcdef0123456789abcdef",
        "alpine",
    ] {
        let (_t, dir, home) = project(Some(&format!("image = {ok}\n")));
        let o = run_in(&dir, &home, &["--dry-run"]);
        assert_eq!(o.code, 0, "{ok}: {}", o.stderr);
    }
}

#[test]
fn missing_empty_and_dangling_configs_are_said() {
    let (_t, dir, home) = project(None);
    let o = run_in(&dir, &home, &["--dry-run"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("# note: there is no .ai-sandbox/config: nothing is allowed beyond --allow flags (`ai-sandbox init` writes a config)"), "{}", o.stdout);
    assert_eq!(o.stdout.matches("nothing is allowed").count(), 1, "said once");
    let (_t, dir, home) = project(Some("# only comments\n"));
    let o = run_in(&dir, &home, &["--dry-run"]);
    assert!(o.stdout.contains("# note: nothing is set in .ai-sandbox/config"), "{}", o.stdout);
    // Positive control: a config with an entry has no such note.
    let (_t, dir, home) = project(Some("allow = github.com\n"));
    let o = run_in(&dir, &home, &["--dry-run"]);
    assert!(!o.stdout.contains("nothing is allowed") && o.stdout.contains("#   github.com"), "{}", o.stdout);
    // A dangling symlink is not "no config".
    let (_t, dir, home) = project(None);
    std::fs::create_dir_all(dir.join(".ai-sandbox")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/config", dir.join(".ai-sandbox/config")).unwrap();
    let o = run_in(&dir, &home, &["--dry-run"]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("is a symbolic link to /nonexistent/config, which does not exist"),
        "{}",
        o.stderr
    );
}

#[test]
fn init_refuses_root_and_home_and_a_home_config_is_named_as_the_cause() {
    let (_t, dir, home) = project(None);
    let o = run_in(&dir, &home, &["init", "--project", "/"]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("the project directory is `/`") && o.stderr.contains("nothing was written"),
        "{}",
        o.stderr
    );
    assert!(!Path::new("/.ai-sandbox").exists());
    let o = run_in(&home, &home, &["init"]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("your home directory") && !home.join(".ai-sandbox").exists(), "{}", o.stderr);
    // A ~/.ai-sandbox made some other way: a repo under HOME names it as the cause.
    std::fs::create_dir_all(home.join(".ai-sandbox")).unwrap();
    std::fs::write(home.join(".ai-sandbox/config"), "allow = github.com\n").unwrap();
    let sub = home.join("code/app");
    std::fs::create_dir_all(&sub).unwrap();
    let o = run_in(&sub, &home, &["--dry-run"]);
    assert_eq!(o.code, 125);
    let named =
        format!("{} exists, so your home directory is the project", home.join(".ai-sandbox").display());
    assert!(o.stderr.contains(&named), "{}", o.stderr);
    // Positive control: init in a project writes the config.
    let o = run_in(&dir, &home, &["init", "--preset", "npm"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(dir.join(".ai-sandbox/config").exists());
}

/// A `.ai-sandbox` that is a link (a sandbox can make one in a subdirectory) is not written
/// through: `init` below it refuses, names where it leads, and the place it leads is untouched.
#[test]
fn init_writes_no_config_through_a_link() {
    let (_t, dir, home) = project(None);
    let elsewhere = home.join(".config/git");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::os::unix::fs::symlink(&elsewhere, sub.join(".ai-sandbox")).unwrap();
    let o = run_in(&sub, &home, &["init"]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("leads to") && o.stderr.contains("nothing was written"), "{}", o.stderr);
    assert!(!elsewhere.join("config").exists(), "written through the link");
    // A link for the file itself, to a file that exists.
    std::fs::remove_file(sub.join(".ai-sandbox")).unwrap();
    std::fs::create_dir_all(sub.join(".ai-sandbox")).unwrap();
    std::fs::write(elsewhere.join("config"), "[user]\n").unwrap();
    std::os::unix::fs::symlink(elsewhere.join("config"), sub.join(".ai-sandbox/config")).unwrap();
    let o = run_in(&sub, &home, &["init", "--force"]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert_eq!(std::fs::read_to_string(elsewhere.join("config")).unwrap(), "[user]\n");
    // A link to a file that does not exist yet (a sandbox can make one): not created there.
    std::fs::remove_file(sub.join(".ai-sandbox/config")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("new"), sub.join(".ai-sandbox/config")).unwrap();
    let o = run_in(&sub, &home, &["init", "--force", "--project", "."]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("does not exist") && o.stderr.contains("remove the link"), "{}", o.stderr);
    assert!(!elsewhere.join("new").exists(), "created through the link");
    // Control: without the link, init there writes the repository's config (a plain directory).
    std::fs::remove_dir_all(sub.join(".ai-sandbox")).unwrap();
    let o = run_in(&sub, &home, &["init"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(dir.join(".ai-sandbox/config").is_file());
}

#[test]
fn a_project_that_holds_the_tools_own_directories_is_refused_under_either_name() {
    let (_t, dir, home) = project(None);
    // ~/.config is a link to a dotfiles checkout elsewhere (common): refused under both names.
    let dotfiles = dir.parent().unwrap().join("dotfiles");
    std::fs::create_dir_all(dotfiles.join("containers")).unwrap();
    std::fs::create_dir_all(dotfiles.join("nvim/.git")).unwrap();
    std::os::unix::fs::symlink(&dotfiles, home.join(".config")).unwrap();
    for (project, how) in [
        (home.join(".config"), "contains ai-sandbox's configuration"),
        (dotfiles.clone(), "contains ai-sandbox's configuration"),
        (home.join(".local/share/ai-sandbox/homes/x"), "lies inside ai-sandbox's data"),
        (home.join(".local"), "contains ai-sandbox's state"),
    ] {
        std::fs::create_dir_all(&project).unwrap();
        for args in [
            vec!["--dry-run", "--project", project.to_str().unwrap()],
            vec!["init", "--project", project.to_str().unwrap()],
        ] {
            let o = run_in(&dir, &home, &args);
            assert_eq!(o.code, 125, "{args:?}: {}", o.stdout);
            assert!(
                o.stderr.contains(how) && o.stderr.contains("use a directory that holds only the project"),
                "{args:?}: {}",
                o.stderr
            );
            assert!(!o.stdout.contains("podman"), "{args:?}: a plan was printed");
        }
        assert!(!project.join(".ai-sandbox").exists(), "init wrote into {}", project.display());
    }
    // Control: a repository in a subfolder of the linked ~/.config plans a sandbox.
    let o = run_in(&home.join(".config/nvim"), &home, &["--dry-run"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("podman"), "{}", o.stdout);
}

#[test]
fn rules_takes_only_the_flags_that_shape_the_ruleset() {
    let (_t, dir, home) = project(Some("allow = 100.64.0.1:5432\n"));
    for bad in [
        &["rules", "--image", "x"][..],
        &["rules", "--dry-run"],
        &["rules", "-e", "A=1"],
        &["rules", "--shell"],
    ] {
        let o = run_in(&dir, &home, bad);
        assert_ne!(o.code, 0, "{bad:?} accepted");
        assert!(o.stderr.contains("unexpected argument"), "{bad:?}: {}", o.stderr);
    }
    let o = run_in(&dir, &home, &["rules", "--allow", "100.64.0.1:6379"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("100.64.0.1 . 6379") && o.stdout.contains("100.64.0.1 . 5432"), "{}", o.stdout);
}

#[test]
fn secrets_are_named_in_a_dry_run_never_shown_and_bad_ones_refused() {
    let (_t, dir, home) =
        project(Some("secret = API_TOKEN\nsecret = DB_PASSWORD from ~/.db-password\nenv = PLAIN=visible\n"));
    let o = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .args(["--dry-run", "-e", "OPENAI_API_KEY", "-e", "ANOTHER=given-on-the-command-line"])
        .current_dir(&dir)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("OPENAI_API_KEY", "sk-live-0123456789")
        .env("API_TOKEN", "tok-abcdef")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for never in ["sk-live-0123456789", "tok-abcdef"] {
        assert!(!out.contains(never), "a secret value in the dry run: {out}");
    }
    for shown in [
        "OPENAI_API_KEY=<secret from $OPENAI_API_KEY>",
        "API_TOKEN=<secret from $API_TOKEN>",
        "DB_PASSWORD=<secret from ~/.db-password>",
        "PLAIN=visible",
    ] {
        assert!(out.contains(shown), "{shown} missing: {out}");
    }
    let argv: String = out.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    assert!(
        !argv.contains("PLAIN=") && !argv.contains("ANOTHER="),
        "values on the podman command line: {argv}"
    );
    refused(Some("secret = DB from relative/file\n"), &[], &["not an absolute path"]);
    refused(Some("secret = 1BAD\n"), &[], &["not a valid environment variable name"]);
    refused(Some("secret = K\nenv = K=v\n"), &[], &["K is already set on line 1"]);
    refused(Some("env = TOKEN\n"), &[], &["use `secret = TOKEN`"]);
}

#[test]
fn trust_checks_a_config_as_a_launch_would_and_names_what_widens() {
    for bad in ["protect = ../x\n", "resolve = x.example=notanip\n", "allow = 100.64.0.1\n"] {
        let (_t, dir, home) = project(Some(bad));
        let o = run_in(&dir, &home, &["trust"]);
        assert_eq!(o.code, 125, "{bad}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(".ai-sandbox/config:1:") && o.stderr.contains("nothing was approved"),
            "{bad}: {}",
            o.stderr
        );
        let show = run_in(&dir, &home, &["trust", "--show"]);
        assert_eq!(show.code, 1, "{bad}: never approved: {}", show.stdout);
    }
    // Positive control: a valid config with lines worth a look is approved, and they are named.
    let text = "secret = DEPLOY_KEY from ~/.ssh/id_ed25519\nallow = 169.254.169.254:80\nallow = [2001:db8::1]:443\n\
                resolve = api.internal.example=10.1.2.3\nallow = github.com\n";
    let (_t, dir, home) = project(Some(text));
    let o = run_in(&dir, &home, &["trust"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for want in [
        "line 1: secret = DEPLOY_KEY from ~/.ssh/id_ed25519",
        "reads the file ~/.ssh/id_ed25519 on your machine",
        "line 2: allow = 169.254.169.254:80",
        "the cloud metadata service",
        "line 3: allow = [2001:db8::1]:443",
        "an IPv6 entry",
        "line 4: resolve = api.internal.example=10.1.2.3",
        "approved .ai-sandbox/config",
    ] {
        assert!(o.stdout.contains(want), "expected {want:?} in:\n{}", o.stdout);
    }
    assert!(o.stdout.contains("line 5: allow = github.com"), "a name the sandbox may reach:\n{}", o.stdout);
    assert_eq!(run_in(&dir, &home, &["trust", "--show"]).code, 0);
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_with_no_panic() {
    // `ai-sandbox logs | head -1`: the reader is gone before (or while) the command writes.
    let (_t, dir, home) = project(Some("allow = github.com\n"));
    let log = home.join("run/ai-sandbox/gate.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, "{\"time\":\"2026-12-01T00:00:00Z\",\"session\":\"s\",\"host\":\"a.example\",\"port\":443,\"decision\":\"deny\",\"reason\":\"r\"}\n".repeat(50)).unwrap();
    for args in
        [&["man"][..], &["completions", "bash"], &["gate", "logs"], &["logs"], &["--dry-run"], &["rules"]]
    {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let o = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
            .args(args)
            .current_dir(&dir)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", "/usr/bin:/bin")
            .env("XDG_RUNTIME_DIR", home.join("run"))
            .stdout(std::process::Stdio::from(write))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert_ne!(o.status.code(), Some(101), "{args:?}: {stderr}");
    }
}

#[test]
fn input_that_is_not_utf8_is_refused_in_words_never_with_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let (_t, dir, home) = project(None);
    let bad = std::ffi::OsStr::from_bytes(b"X=\xff");
    let o = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .args([
            std::ffi::OsStr::new("--dry-run"),
            std::ffi::OsStr::new("-e"),
            bad,
            std::ffi::OsStr::new("--"),
            std::ffi::OsStr::new("true"),
        ])
        .current_dir(&dir)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    // Which argument, and that the command after `--` is where bytes may go.
    assert!(stderr.contains("the argument $'X=\\xff' is not UTF-8 text"), "{stderr}");
    assert!(stderr.contains("only the command after `--` may carry any bytes"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Positive control: bytes after `--` are planned, rebuilt inside by a shell (octal escapes).
    let o = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .args([std::ffi::OsStr::new("--dry-run"), "--".as_ref(), "ls".as_ref(), bad])
        .current_dir(&dir)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let cmd: Vec<&str> =
        out.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    let words = shlex::split(&cmd.join("\n").replace(" \\\n", " ")).unwrap();
    assert!(words.last().unwrap().contains("a1=$(printf 'X=\\377_')"), "{out}");
    // A project directory whose name is not UTF-8.
    let odd = dir.parent().unwrap().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir_all(odd.join(".git")).unwrap();
    let o = run_in(&odd, &home, &["--dry-run", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("path is not UTF-8") && !o.stderr.contains("panicked"), "{}", o.stderr);
    // A working directory inside the project whose name is not UTF-8: podman would mangle it.
    let sub = dir.join(std::ffi::OsStr::from_bytes(b"sub\xe9"));
    std::fs::create_dir_all(&sub).unwrap();
    let o = run_in(&sub, &home, &["--dry-run", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("the working directory's path is not UTF-8"), "{}", o.stderr);
    // Positive control: the same run in a UTF-8 directory plans, and starts there.
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let o = run_in(&dir.join("sub"), &home, &["--dry-run", "--", "true"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(&format!("--workdir \\\n  {}/sub \\", dir.display())), "{}", o.stdout);
}

#[test]
fn home_and_the_proxy_variables_are_refused_with_words_that_fit_where_they_were_given() {
    refused(None, &["-e", "HOME=/tmp"], &["-e: HOME is the sandbox's own per-project home", "drop this -e"]);
    refused(Some("env = HOME=/tmp\n"), &[], &["config:1: HOME is the sandbox's own", "delete this line"]);
    let flag = refused(
        None,
        &["-e", "HTTP_PROXY=http://other:3128"],
        &["set by ai-sandbox to the egress gate", "drop this -e"],
    );
    assert!(!flag.contains("delete this line"), "{flag}");
    refused(
        Some("env = HTTP_PROXY=x\n"),
        &[],
        &["config:1: HTTP_PROXY is set by ai-sandbox", "delete this line"],
    );
    // Positive control: another variable passes.
    let (_t, dir, home) = project(None);
    assert_eq!(run_in(&dir, &home, &["--dry-run", "-e", "FOO=1", "--", "true"]).code, 0);
}

#[test]
fn every_config_key_is_listed_by_help_config_and_the_man_page() {
    let (_t, dir, home) = project(None);
    let help = run_in(&dir, &home, &["help", "config"]);
    assert_eq!(help.code, 0, "{}", help.stderr);
    let man = run_in(&dir, &home, &["man"]);
    let conf = man.stdout.split(".SH CONFIGURATION").nth(1).unwrap_or_default();
    let conf = conf.split(".SH ENVIRONMENT").next().unwrap_or_default();
    for key in ai_sandbox::policy::keys::KEYS.iter().map(|k| k.name) {
        assert!(help.stdout.contains(&format!("  {key} ")), "help config lacks {key}:\n{}", help.stdout);
        assert!(conf.contains(&format!("\\fB{key} ")), "the man page lacks {key}:\n{conf}");
    }
    // The commented example comes with the binary, and help config points at it.
    assert!(
        help.stdout.contains("`ai-sandbox help config-example`") && !help.stdout.contains("in the sources")
    );
    let example = run_in(&dir, &home, &["help", "config-example"]);
    assert_eq!(example.code, 0, "{}", example.stderr);
    assert_eq!(
        example.stdout,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example")).unwrap()
    );
}

#[test]
fn a_mistyped_flag_or_subcommand_gets_one_hint_not_two_that_disagree() {
    let (_t, dir, home) = project(None);
    for args in [&["--alow", "x"][..], &["export", "docker"]] {
        let o = run_in(&dir, &home, args);
        assert_eq!(o.code, 125, "{args:?}");
        assert!(!o.stderr.contains("put it after `--`"), "{args:?}: {}", o.stderr);
    }
    assert!(run_in(&dir, &home, &["--alow", "x"]).stderr.contains("a similar argument exists: '--allow'"));
    // Positive control: a command given without `--` still gets the `--` hint.
    let o = run_in(&dir, &home, &["npm", "test"]);
    assert!(o.stderr.contains("put it after `--`: ai-sandbox -- npm test"), "{}", o.stderr);
}

#[test]
fn several_entries_in_one_flag_are_told_how_to_give_them_as_flags() {
    let e = refused(
        None,
        &["--allow", "a.example,b.example"],
        &["--allow: bad allow entry", "--allow a.example --allow b.example"],
    );
    assert!(!e.contains("one entry per line"), "a flag has no lines: {e}");
    refused(
        Some("allow = a.example,b.example\n"),
        &[],
        &["config:1:", "one entry per line: `allow = a.example`"],
    );
}

#[test]
fn presets_are_completed_split_at_commas_and_a_near_miss_is_named() {
    let (_t, dir, home) = project(None);
    let bash = run_in(&dir, &home, &["completions", "bash"]);
    assert!(
        bash.stdout.contains("claude codex gemini opencode aider npm pypi cargo github"),
        "no preset names to complete"
    );
    let miss = run_in(&dir, &home, &["init", "--preset", "clade"]);
    assert_eq!(miss.code, 125);
    assert!(miss.stderr.contains("a similar value exists: 'claude'"), "{}", miss.stderr);
    assert!(!dir.join(".ai-sandbox/config").exists(), "nothing written on a miss");
    let both = run_in(&dir, &home, &["init", "--preset", "claude,npm"]);
    assert_eq!(both.code, 0, "{}", both.stderr);
    let text = std::fs::read_to_string(dir.join(".ai-sandbox/config")).unwrap();
    assert!(
        text.contains("allow = api.anthropic.com") && text.contains("allow = registry.npmjs.org"),
        "{text}"
    );
}

#[test]
fn a_git_identity_line_that_is_no_identity_is_refused_with_the_form() {
    refused(
        Some("git_identity = somebody\n"),
        &[],
        &[
            ".ai-sandbox/config:1: `git_identity = somebody` is not `host`, `off` or `Name <email>`",
            "Agent <agent@example.com>",
        ],
    );
}

/// The approval prompt needs a terminal to answer on (stdin) and one to show it (stderr): a piped
/// stdout (`ai-sandbox | tee log`) still gets the question.
#[test]
fn the_approval_prompt_is_asked_with_stdout_piped() {
    use std::io::{Read, Write};
    let (_t, dir, home) = project(Some("allow = github.com\n"));
    let pty = nix::pty::openpty(None, None).unwrap();
    let tty = std::fs::File::from(pty.slave);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .args(["--", "true"])
        .current_dir(&dir)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .stdin(tty.try_clone().unwrap())
        .stderr(tty.try_clone().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(tty);
    let mut master = std::fs::File::from(pty.master);
    let mut shown = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&shown).contains("[y/N]") {
        let n = master.read(&mut buf).unwrap_or(0);
        assert!(n > 0, "no question: {}", String::from_utf8_lossy(&shown));
        shown.extend_from_slice(&buf[..n]);
    }
    assert!(
        String::from_utf8_lossy(&shown).contains("Approve this config"),
        "{}",
        String::from_utf8_lossy(&shown)
    );
    master.write_all(b"n\r").unwrap();
    assert_ne!(child.wait().unwrap().code(), Some(0), "not approved: nothing started");
}

/// An extra argument that mounts HOME read-write under a name that leads there through a link
/// (`/home/u` where `/home` leads to `/var/home`) is refused as HOME itself is: the launcher
/// hands the policy the host's own resolution.
#[test]
fn a_mount_of_home_through_a_link_is_refused_and_a_directory_beside_it_is_not() {
    let (t, dir, home) = project(None);
    let alias = t.path().join("alias");
    std::os::unix::fs::symlink(&home, &alias).unwrap();
    let o = run_in(&dir, &home, &["--dry-run", "--net", "none", "--", "true"]);
    assert_eq!(o.code, 0, "control, no extra argument: {}", o.stderr);
    std::fs::create_dir_all(dir.join(".ai-sandbox")).unwrap();
    std::fs::write(dir.join(".ai-sandbox/config"), format!("extra_args = -v {}:/h\n", alias.display()))
        .unwrap();
    let o = run_in(&dir, &home, &["--dry-run", "--net", "none", "--", "true"]);
    assert_ne!(o.code, 0, "accepted:\n{}", o.stdout);
    assert!(o.stderr.contains("your home directory"), "{}", o.stderr);
    // Control: a directory beside HOME through the same kind of link is mounted as asked.
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(&data, t.path().join("data-link")).unwrap();
    let line = format!("extra_args = -v {}:/d\n", t.path().join("data-link").display());
    std::fs::write(dir.join(".ai-sandbox/config"), line).unwrap();
    let o = run_in(&dir, &home, &["--dry-run", "--net", "none", "--", "true"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("data-link:/d"), "{}", o.stdout);
}
