//! Snapshot tests of the whole pure pipeline (config + CLI + env → Plan → `--dry-run` text),
//! driven through `FakeHost`, which also proves that a dry run asks for no side effect.

use ai_sandbox::cli::Cli;
use ai_sandbox::cli::{app, change, sessions, setup};
use ai_sandbox::host::{Effect, FakeHost, Kind};
use clap::Parser;
use std::path::Path;

mod support;
use support::{DESIGN_CONFIG, host};

/// The podman argv printed by `--dry-run`, parsed back as a shell would.
fn argv_of(out: &str) -> Vec<String> {
    let cmd: Vec<&str> =
        out.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    shlex::split(&cmd.join("\n").replace(" \\\n", " ")).expect("the printed command parses as shell words")
}

/// The podman argv of the one plan `h` launched, as one line.
fn launched(h: &FakeHost) -> String {
    let argv: Vec<&Vec<String>> = h
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Launch(argv) => Some(argv),
            _ => None,
        })
        .collect();
    assert_eq!(argv.len(), 1, "one launch: {:?}", h.effects);
    argv[0].join(" ")
}

fn dry_run(h: &mut FakeHost, args: &[&str]) -> String {
    let cli = Cli::try_parse_from(["ai-sandbox", "--dry-run"].iter().chain(args)).unwrap();
    let code = app::run(h, &cli.run).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(code, 0);
    assert!(h.effects.is_empty(), "--dry-run caused side effects: {:?}", h.effects);
    h.stdout.clone()
}

#[test]
fn design_config() {
    let mut h = host(DESIGN_CONFIG, &[]);
    insta::assert_snapshot!(dry_run(&mut h, &[]));
}

#[test]
fn allow_host_postgres_from_cli() {
    let mut h = host("", &[]);
    insta::assert_snapshot!(dry_run(
        &mut h,
        &["--allow", "100.64.0.1:5432", "--", "psql", "-h", "100.64.0.1"]
    ));
}

#[test]
fn net_none() {
    let mut h = host("allow = github.com\n", &[]);
    insta::assert_snapshot!(dry_run(&mut h, &["--net", "none", "--", "cargo", "test", "--offline"]));
}

#[test]
fn net_full_with_extra_publish_args() {
    let mut h = host("", &[("AISB_EXTRA_ARGS", "-p 8000:8000")]);
    insta::assert_snapshot!(dry_run(&mut h, &["--net", "full", "--", "npm", "run", "dev"]));
}

#[test]
fn two_published_ports() {
    let mut h = host("publish = 8000\n", &[]);
    insta::assert_snapshot!(dry_run(&mut h, &["--publish", "8080:3000", "--", "npm", "run", "dev"]));
}

#[test]
fn user_no_proxy_is_merged() {
    let mut h = host("env = NO_PROXY=internal.example,10.1.2.3\nallow = 10.1.2.3:8080\n", &[]);
    insta::assert_snapshot!(dry_run(&mut h, &["-e", "no_proxy=other.example"]));
}

#[test]
fn aisb_extra_args_follow_config_extra_args() {
    let mut h =
        host("extra_args = --memory 2g\n", &[("AISB_EXTRA_ARGS", "-v /cache:/cache:ro --pids-limit 512")]);
    // A cgroup v2 host, where podman enforces both (on v1 they are left out: below).
    h.files.push(("/sys/fs/cgroup/cgroup.controllers".into(), "memory pids\n".into()));
    h.files.push(("/proc/self/cgroup".into(), "0::/\n".into()));
    let out = dry_run(&mut h, &["--", "true"]);
    let args = argv_of(&out);
    let pos = |a: &str| args.iter().position(|x| x == a).unwrap_or_else(|| panic!("{a} missing"));
    assert!(pos("--http-proxy=false") < pos("--memory"), "ours first");
    assert!(pos("2g") < pos("/cache:/cache:ro"), "config before AISB_EXTRA_ARGS");
    assert!(pos("512") < pos("--rootfs"), "all options before the rootfs positional");
    insta::assert_snapshot!(out);
    // cgroup v1: left out (podman would ignore them and warn on every run), and said.
    h.files.retain(|(p, _)| !p.starts_with("/sys/fs/cgroup"));
    h.stdout.clear();
    let v1 = dry_run(&mut h, &["--", "true"]);
    let args = argv_of(&v1);
    assert!(
        !args.iter().any(|a| a == "--memory" || a == "2g" || a == "512")
            && args.iter().any(|a| a == "/cache:/cache:ro"),
        "{v1}"
    );
    assert!(
        v1.contains("extra_args `--memory 2g --pids-limit 512`: left out, not enforced on this host"),
        "{v1}"
    );
}

#[test]
fn no_gate_allows_dns_to_the_pasta_resolver_only() {
    let mut h = host("allow = 192.0.2.0/24:443\n", &[]);
    insta::assert_snapshot!(dry_run(&mut h, &["--no-gate", "--", "true"]));
}

#[test]
fn launch_goes_through_the_host_and_root_is_refused() {
    let mut h = host("", &[]);
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    h.exit_code = 7;
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 7, "exit code passed through");
    assert_eq!(h.effects.len(), 4, "{:?}", h.effects);
    assert_eq!(
        h.effects[0],
        Effect::BlockSignals,
        "the forwarded signals are blocked before any thread starts"
    );
    assert_eq!(
        h.effects[1],
        Effect::RegisterGate { port_from: 18081 },
        "the gate is registered before the plan is built"
    );
    assert_eq!(
        h.effects[2],
        Effect::Canary(Some(45000)),
        "the self-check's listener is bound before the plan"
    );
    let argv = launched(&h);
    assert!(argv.contains("run --rm -i"), "{argv}");
    // The proxy URL (with the token) is not on the command line: `ps` would show it.
    let token = "ab".repeat(16);
    assert!(!argv.contains(&token), "token on argv: {argv}");
    assert!(argv.contains("--env-file /run/user/1000/ai-sandbox/sessions/abababababab/proxy.env"));

    let mut root = host("", &[]);
    root.uid = 0;
    let err = app::run(&mut root, &cli.run).unwrap_err().to_string();
    assert!(err.contains("rootless") && err.contains("runuser -l USER -c 'ai-sandbox ...'"), "{err}");
    assert!(root.effects.is_empty());
}

#[test]
fn a_launch_relays_single_address_entries_and_forwards_them_through_pasta() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--allow", "192.0.2.7:5432", "--", "true"]).unwrap();
    let mut h = host("allow = 100.64.0.1:6379\nallow = 198.51.100.0/24:443\n", &[]);
    app::run(&mut h, &cli.run).unwrap();
    let relays: Vec<&Effect> = h.effects.iter().filter(|e| e.kind() == Kind::Relay).collect();
    assert_eq!(
        relays,
        [&Effect::Relay { port: 40000, to: "192.0.2.7:5432".parse().unwrap() }],
        "{:?}",
        h.effects
    );
    let launch = launched(&h);
    // The host port goes straight to itself; the IP entry to the relay bound for it; a network
    // has no one address to relay to.
    assert!(
        launch.contains("pasta:--map-host-loopback,100.64.0.1,-T,18082,-T,61000:6379,-T,61001:40000 "),
        "{launch}"
    );
    // Positive control: without single-address entries, nothing is relayed.
    let mut h = host("allow = 198.51.100.0/24:443\n", &[]);
    app::run(&mut h, &Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap().run).unwrap();
    assert!(!h.effects.iter().any(|e| e.kind() == Kind::Relay), "{:?}", h.effects);
    assert!(h.effects.iter().any(|e| e.kind() == Kind::Launch), "{:?}", h.effects);
}

#[test]
fn tty_adds_t_and_shell_is_the_default_command() {
    let mut h = host("", &[]);
    h.tty = true;
    let out = dry_run(&mut h, &[]);
    assert!(out.contains("\n  -t \\\n"));
    assert!(out.contains("/bin/bash\n"));
}

#[test]
fn config_example_parses_and_dry_runs() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example")).unwrap();
    let mut h = host(&text, &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    assert!(out.contains("100.64.0.1 . 5432"), "{out}");
    assert!(out.contains("DATABASE_URL=postgresql://dev@100.64.0.1:5432/app_dev"));
    assert!(out.contains("NO_PROXY=localhost,127.0.0.1,::1,internal.example,100.64.0.1"));
    for key in ai_sandbox::policy::keys::KEYS.iter().map(|k| k.name) {
        assert!(text.contains(&format!("{key} =")), "config.example does not show `{key}`");
    }
}

#[test]
fn ruleset_and_proxy_url_use_the_gates_actual_port() {
    let (cfg, errs) = ai_sandbox::policy::keys::read("gate_port = 18081\n");
    assert!(errs.is_empty());
    let p = ai_sandbox::policy::build("/w/p".into(), &cfg, &ai_sandbox::policy::Inputs::default()).unwrap();
    let mut h = host("", &[]);
    let mut facts = app::gather_facts(&mut h, &p, app::Intent::DryRun).unwrap();
    facts.gate_port = 20000;
    let plan = ai_sandbox::plan::build(&p, &facts);
    let text = plan.ruleset.unwrap().to_text();
    assert!(text.contains("ip daddr 100.64.0.1 tcp dport 20000 accept"), "{text}");
    assert!(!text.contains("18081"), "{text}");
    let (_, env) = plan.env_file.expect("proxy env file");
    // The sandbox reaches the gate on its own loopback, spliced by pasta to the host's.
    assert!(env.contains("HTTPS_PROXY=http://aisb:SESSION-TOKEN@127.0.0.1:20000\n"), "{env}");
    assert!(
        plan.argv.contains(&"pasta:--map-host-loopback,100.64.0.1,-T,20000".to_string()),
        "{:?}",
        plan.argv
    );
    assert!(!plan.argv.iter().any(|a| a.contains("SESSION-TOKEN")), "{:?}", plan.argv);
}

#[test]
fn init_writes_the_config_and_never_overwrites_without_force() {
    let mut h = host("", &[]);
    h.files.clear();
    let presets = vec!["claude".to_string(), "npm".to_string()];
    assert_eq!(setup::init(&mut h, &presets, false, None).unwrap(), 0);
    let written: Vec<&Path> = h
        .effects
        .iter()
        .map(|e| match e {
            Effect::Write(p) => p.as_path(),
            other => panic!("init did more than write files: {other:?}"),
        })
        .collect();
    assert_eq!(written.len(), 3, "{:?}", h.effects);
    assert_eq!(written[0], Path::new("/home/dev/app/.ai-sandbox/config"));
    assert!(written[1].ends_with("approved-config"), "what init writes counts as approved: {:?}", h.effects);
    assert!(written[2].ends_with("project"), "the project's path is recorded for prune: {:?}", h.effects);
    let written = h.files[0].1.clone();
    assert!(written.contains("allow = api.anthropic.com\n") && written.contains("cmd = claude\n"));
    let err = setup::init(&mut h, &["pypi".to_string()], false, None).unwrap_err().to_string();
    assert!(err.contains("already exists") && err.contains("--force"), "{err}");
    assert_eq!(h.effects.len(), 3, "nothing written the second time");
    assert_eq!(h.files[0].1, written, "the existing config is untouched");
    setup::init(&mut h, &["pypi".to_string()], true, None).unwrap();
    let config = h.files.iter().find(|(p, _)| p.ends_with(".ai-sandbox/config")).unwrap();
    assert!(config.1.contains("allow = pypi.org"));
}

#[test]
fn an_unauthenticated_redis_on_an_allowed_host_port_is_warned_about() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--allow", "100.64.0.1:6379", "--", "true"]).unwrap();
    let mut h = host("", &[]);
    h.loopback.push((6379, b"+PONG\r\n".to_vec()));
    app::run(&mut h, &cli.run).unwrap();
    assert!(h.stderr.contains("127.0.0.1:6379, where redis answers without authentication"), "{}", h.stderr);
    assert!(h.stderr.contains("requirepass"));
    // Positive control: a redis that wants a password gets no warning, and is still probed.
    let mut h = host("", &[]);
    h.loopback.push((6379, b"-NOAUTH Authentication required.\r\n".to_vec()));
    app::run(&mut h, &cli.run).unwrap();
    assert!(h.effects.contains(&Effect::Probe(6379)), "{:?}", h.effects);
    assert!(!h.stderr.contains("warning"), "{}", h.stderr);
}

#[test]
fn completions_and_man_page_come_from_the_cli_definition() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ai-sandbox")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let bash = run(&["completions", "bash"]);
    assert!(
        bash.contains("--publish") && bash.contains("--no-gate") && bash.contains("init"),
        "bash completion"
    );
    assert!(run(&["completions", "zsh"]).contains("--dry-run"));
    let man = run(&["man"]);
    assert!(man.starts_with(".ie") || man.contains(".TH"), "roff");
    assert!(
        man.contains(".SH EXAMPLES") && man.contains("ai\\-sandbox \\-\\-publish 8000"),
        "examples: {man}"
    );
    for section in [".SH COMMANDS", ".SH ENVIRONMENT", ".SH FILES", ".SH EXIT STATUS"] {
        assert!(man.contains(section), "{section} missing");
    }
    assert!(man.contains("AISB_EXTRA_ARGS") && man.contains("gate.log") && man.contains("125"));
    // No references to per-subcommand pages, which are not shipped.
    assert!(!man.contains("(1)"), "the man page names pages that do not exist: {man}");
    let help = run(&["--help"]);
    assert!(help.contains("Examples:") && help.contains("ai-sandbox --publish 8000"), "{help}");
    assert!(help.contains("AISB_EXTRA_ARGS") && help.contains("Environment:"), "{help}");
    assert!(help.contains("for this run only"), "--allow says it does not change the config: {help}");
    let rules = run(&["rules", "--help"]);
    assert!(
        rules.contains("--allow") && !rules.contains("--image") && !rules.contains("--dry-run"),
        "{rules}"
    );
}

#[test]
fn an_unapproved_config_starts_nothing_without_a_terminal_and_says_what_it_says() {
    let mut h = host("allow = github.com\n", &[]);
    // The agent adds a mount of the real HOME to the config.
    h.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    h.files.push((
        "/home/dev/app/.ai-sandbox/config".into(),
        "allow = github.com\nextra_args = -v /srv/data:/data\n".into(),
    ));
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    let err = app::run(&mut h, &cli.run).unwrap_err().to_string();
    assert!(err.contains("+extra_args = -v /srv/data:/data"), "the diff: {err}");
    assert!(
        err.contains("! line 2: extra_args = -v /srv/data:/data") && err.contains("mounts a host path"),
        "{err}"
    );
    assert!(err.contains("nothing was started") && err.contains("ai-sandbox trust"), "{err}");
    assert!(!h.effects.iter().any(|e| e.kind() == Kind::Launch), "launched: {:?}", h.effects);
    // `--dry-run` still plans, and says it is not approved.
    let out = dry_run(&mut h, &[]);
    assert!(out.contains("# note: .ai-sandbox/config is not approved"), "{out}");
    // After `ai-sandbox trust`, the same launch goes ahead (positive control).
    setup::trust_cmd(&mut h, None, false).unwrap();
    assert!(h.stdout.contains("approved .ai-sandbox/config for /home/dev/app"), "{}", h.stdout);
    let code = app::run(&mut h, &cli.run).unwrap();
    assert_eq!(code, 0);
    assert!(launched(&h).contains("/srv/data:/data"), "{:?}", h.effects);
}

#[test]
fn on_a_terminal_the_user_is_asked_and_only_yes_approves() {
    let mut h = host("", &[]);
    h.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    h.files.push(("/home/dev/app/.ai-sandbox/config".into(), "net = full\n".into()));
    h.tty = true;
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    h.answers = vec![false];
    let err = app::run(&mut h, &cli.run).unwrap_err().to_string();
    assert!(err.contains("not approved; nothing was started"), "{err}");
    assert!(
        h.stderr.contains("has not been approved for this project")
            || h.stderr.contains("changed since you approved it"),
        "{}",
        h.stderr
    );
    assert!(h.stderr.contains("turns the egress policy off"), "{}", h.stderr);
    assert!(h.stderr.contains("[y/N]"));
    h.answers = vec![true];
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0, "yes approves and starts");
    // Approved now: no question the next time, comments may change freely.
    h.tty = false;
    h.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    h.files.push(("/home/dev/app/.ai-sandbox/config".into(), "# preview server\nnet   =   full\n".into()));
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0);
}

#[test]
fn protected_paths_that_exist_are_read_only_in_the_podman_command() {
    let mut h = host("protect = scripts/deploy.sh\n", &[]);
    h.files.push(("/home/dev/app/.git/config".into(), "[core]\n".into()));
    h.files.push(("/home/dev/app/.git/hooks/pre-commit".into(), "#!/bin/sh\n".into()));
    h.files.push(("/home/dev/app/scripts/deploy.sh".into(), "echo\n".into()));
    let argv = argv_of(&dry_run(&mut h, &[]));
    for ro in [".ai-sandbox", ".git/hooks", ".git/config", "scripts/deploy.sh"] {
        let m = format!("/home/dev/app/{ro}:/home/dev/app/{ro}:ro");
        assert!(argv.contains(&m), "{m} missing from {argv:?}");
    }
    assert!(!argv.iter().any(|a| a.contains(".vscode")), "only paths that exist are mounted");
}

#[test]
fn gemini_clis_google_login_is_held_by_the_gate_and_said() {
    let mut h = host("state = gemini\n", &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    let held = "# note: state = gemini: the gate holds the tokens your login store has (access_token to \
                cloudcode-pa.googleapis.com, oauth2.googleapis.com; refresh_token only in refreshes at \
                https://oauth2.googleapis.com/token; id_token nowhere); the sandbox holds placeholders, and the gate \
                makes the refreshes (the allowlist must name oauth2.googleapis.com)";
    assert!(out.contains(held), "{out}");
    let store = "/home/dev/.local/share/ai-sandbox/agents";
    for line in [
        format!("#   {store}/gemini/login/oauth_creds.json -> ~/.gemini/oauth_creds.json"),
        format!("#   {store}/gemini/login/google_accounts.json -> ~/.gemini/google_accounts.json"),
    ] {
        assert!(out.contains(&line), "{line} in {out}");
    }
    assert!(!out.contains("GEMINI_CLI_HOME"), "the sandbox HOME is Gemini CLI's home: {out}");
    // The former preset's line beside it would carry the same file in clear: refused, said.
    let mut both = host("", &[]);
    both.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    let text = "state = gemini\nstate = ~/.gemini/oauth_creds.json\n";
    both.files.push(("/home/dev/app/.ai-sandbox/config".into(), text.into()));
    let cli = Cli::try_parse_from(["ai-sandbox", "--dry-run", "--", "true"]).unwrap();
    let e = format!("{:#}", app::run(&mut both, &cli.run).unwrap_err());
    assert!(
        e.contains(":2:")
            && e.contains("carries ~/.gemini/oauth_creds.json, which another state line carries too"),
        "{e}"
    );
    // Control: with no gate, the agent holds it in clear.
    let out_none = dry_run(&mut host("state = gemini\n", &[]), &["--net", "none", "--", "true"]);
    assert!(out_none.contains("# note: state = gemini: the agent holds the login in clear"), "{out_none}");
}

#[test]
fn a_state_line_carries_the_login_only_and_mounts_no_store() {
    let mut h = host("state = claude\nstate = ~/.config/gh/hosts.yml\n", &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    let argv = argv_of(&out);
    let store = "/home/dev/.local/share/ai-sandbox/agents";
    assert!(!argv.iter().any(|a| a.contains(store)), "no store is mounted: {argv:?}");
    assert!(!argv.iter().any(|a| a.starts_with("/home/dev/.claude:")), "the real ~/.claude is never mounted");
    assert!(out.contains("CLAUDE_CONFIG_DIR=/home/dev/.claude"), "{out}");
    let held = "# note: state = claude: the gate holds the tokens your login store has (claudeAiOauth.accessToken to api.anthropic.com; \
                claudeAiOauth.refreshToken only in refreshes at https://platform.claude.com/v1/oauth/token; primaryApiKey to \
                api.anthropic.com); the sandbox holds placeholders, and the gate makes the refreshes (the allowlist must name \
                platform.claude.com); with none in the store, the gate takes the tokens of a login made inside the same way";
    assert!(out.contains(held), "{out}");
    let said = "# note: state = ~/.config/gh/hosts.yml: the agent holds the login in clear, with any refresh token it carries";
    assert!(out.contains(said), "{out}");
    // Control: with no gate (`--net none`), the agent holds Claude's login in clear.
    let mut offline = host("state = claude\n", &[]);
    let out_none = dry_run(&mut offline, &["--net", "none", "--", "true"]);
    assert!(out_none.contains("# note: state = claude: the agent holds the login in clear"), "{out_none}");
    assert!(!out_none.contains("the gate holds"), "{out_none}");
    let mut none = host("allow = example.com\n", &[]);
    let plain = dry_run(&mut none, &["--", "true"]);
    assert!(!plain.contains("holds the login"), "no state line, no login: {plain}");
    for line in [
        format!("#   {store}/claude/login/.credentials.json -> ~/.claude/.credentials.json (claudeAiOauth)"),
        format!("#   {store}/claude/login/.claude.json -> ~/.claude/.claude.json (oauthAccount, userID,"),
        format!("#   {store}/home/.config/gh/hosts.yml -> ~/.config/gh/hosts.yml (the whole file)"),
    ] {
        assert!(out.contains(&line), "{line} missing from\n{out}");
    }
    // A directory is not a login: the line names the file.
    let mut h = host("", &[]);
    h.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    h.files.push(("/home/dev/app/.ai-sandbox/config".into(), "state = ~/.config/tool/\n".into()));
    let cli = Cli::try_parse_from(["ai-sandbox", "--dry-run", "--", "true"]).unwrap();
    let e = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(e.contains("is not a file under HOME") && e.contains("state = ~/.config/gh/hosts.yml"), "{e}");
}

#[test]
fn ssh_agent_is_passed_in_only_when_asked_and_said_out_loud() {
    let sock = "/tmp/ssh-XYZ/agent.42";
    let mut h = host("allow = github.com:22\n", &[("SSH_AUTH_SOCK", sock)]);
    let without = dry_run(&mut h, &["--", "true"]);
    assert!(!without.contains(sock) && !without.contains("SSH_AUTH_SOCK"), "{without}");
    h.files.push((sock.into(), String::new()));
    h.stdout.clear();
    let with = dry_run(&mut h, &["--ssh-agent", "--", "true"]);
    let argv = argv_of(&with);
    assert!(argv.contains(&format!("{sock}:/run/ai-sandbox/ssh-agent.sock")), "{argv:?}");
    assert!(with.contains("SSH_AUTH_SOCK=/run/ai-sandbox/ssh-agent.sock"), "{with}");
    assert!(with.contains("can sign with every key your ssh-agent holds"), "{with}");
    // No agent: nothing starts, and the error says what to do.
    let mut h = host("", &[]);
    let cli = Cli::try_parse_from(["ai-sandbox", "--ssh-agent", "--", "true"]).unwrap();
    let e = app::run(&mut h, &cli.run).unwrap_err();
    assert!(format!("{e:#}").contains("SSH_AUTH_SOCK is not set"), "{e:#}");
    assert!(h.effects.is_empty(), "{:?}", h.effects);
}

#[test]
fn login_import_says_which_files_then_copies_their_login_only() {
    let mut h = host("", &[]);
    h.files.push(("/home/dev/.claude/.credentials.json".into(), "{\"claudeAiOauth\":{\"t\":\"x\"}}".into()));
    h.files.push((
        "/home/dev/.claude.json".into(),
        "{\"userID\":\"u\",\"mcpServers\":{\"x\":{\"command\":\"sh\"}}}".into(),
    ));
    assert_eq!(setup::login_import(&mut h, "claude").unwrap(), 0);
    let store = "/home/dev/.local/share/ai-sandbox/agents/claude/login";
    assert!(
        h.stdout.contains(&format!(
            "~/.claude/.credentials.json -> {store}/.credentials.json (only claudeAiOauth)"
        )),
        "{}",
        h.stdout
    );
    assert!(
        h.stdout.contains(&format!("~/.claude.json -> {store}/.claude.json (only oauthAccount")),
        "{}",
        h.stdout
    );
    assert_eq!(h.effects.iter().filter(|e| e.kind() == Kind::Copy).count(), 2, "{:?}", h.effects);
    let copied = h.files.iter().find(|(p, _)| p.ends_with("login/.claude.json")).unwrap();
    assert!(copied.1.contains("\"u\"") && !copied.1.contains("mcpServers"), "{}", copied.1);
    let err = setup::login_import(&mut h, "codex").unwrap_err().to_string();
    assert!(err.contains("no codex login found") && err.contains("~/.codex/auth.json"), "{err}");
    assert!(
        setup::login_import(&mut h, "vim").unwrap_err().to_string().contains("known agents: claude, codex")
    );
}

#[test]
fn allow_changes_each_running_sandbox_then_the_config_which_stays_approved() {
    let mut h = host("allow = a.test\n", &[]);
    h.live = vec!["/run/user/1000/ai-sandbox/sessions/abc/live.json".into()];
    let cli = Cli::try_parse_from(["ai-sandbox", "allow", "b.test", "10.0.0.1:5432"]).unwrap();
    let Some(ai_sandbox::cli::Sub::Allow(args)) = &cli.sub else { panic!() };
    assert_eq!(change::change_cmd(&mut h, args, change::Verb::Allow).unwrap(), 0);
    assert!(
        h.effects.contains(&Effect::LiveAllow {
            change: "b.test, 10.0.0.1:5432".into(),
            record: "/run/user/1000/ai-sandbox/sessions/abc/live.json".into()
        }),
        "{:?}",
        h.effects
    );
    assert!(h.stdout.contains("allowed b.test, 10.0.0.1:5432 in the running sandbox abc"), "{}", h.stdout);
    let cfg = h.files.iter().rev().find(|(p, _)| p.ends_with(".ai-sandbox/config")).unwrap().1.clone();
    assert_eq!(cfg, "allow = a.test\nallow = b.test\nallow = 10.0.0.1:5432\n");
    assert!(h.stdout.contains("(approved)"), "{}", h.stdout);
    h.stdout.clear();
    assert_eq!(setup::trust_cmd(&mut h, None, true).unwrap(), 0, "still approved: {}", h.stdout);
    // A bad item: the config's message, and nothing changes anywhere.
    let before = h.effects.len();
    let cli = Cli::try_parse_from(["ai-sandbox", "allow", "100.64.0.1"]).unwrap();
    let Some(ai_sandbox::cli::Sub::Allow(args)) = &cli.sub else { panic!() };
    let e = change::change_cmd(&mut h, args, change::Verb::Allow).unwrap_err();
    assert!(format!("{e:#}").contains("100.64.0.1"), "{e:#}");
    assert_eq!(h.effects.len(), before, "{:?}", &h.effects[before..]);
}

/// `allow X` after `deny X`: the deny line is taken back in the config (the running sandbox keeps
/// refusing X until it restarts, and is not told X is allowed); a wider deny line stays and
/// nothing changes, said with the line.
#[test]
fn allow_takes_back_a_deny_line_that_names_it_and_never_pretends_past_a_wider_one() {
    let mut h = host("allow = *.a.test\ndeny = x.a.test\ndeny = *.b.test\nallow = c.b.test:8080\n", &[]);
    h.live = vec!["/run/user/1000/ai-sandbox/sessions/abc/live.json".into()];
    let run = |h: &mut FakeHost, items: &[&str]| {
        let cli = Cli::try_parse_from(["ai-sandbox", "allow"].iter().chain(items)).unwrap();
        let Some(ai_sandbox::cli::Sub::Allow(args)) = &cli.sub else { panic!() };
        change::change_cmd(h, args, change::Verb::Allow)
    };
    assert_eq!(run(&mut h, &["x.a.test", "y.test"]).unwrap(), 0);
    assert!(h.stdout.contains("took back `deny = x.a.test` in the config"), "{}", h.stdout);
    assert!(h.stdout.contains("a running one keeps refusing it until it restarts"), "{}", h.stdout);
    assert!(
        h.stdout.contains("allowed y.test in the running sandbox abc")
            && !h.stdout.contains("allowed x.a.test"),
        "{}",
        h.stdout
    );
    let cfg = h.files.iter().rev().find(|(p, _)| p.ends_with(".ai-sandbox/config")).unwrap().1.clone();
    assert_eq!(
        cfg,
        "allow = *.a.test\ndeny = *.b.test\nallow = c.b.test:8080\nallow = x.a.test\nallow = y.test\n"
    );
    // A wider deny line: it stays, and nothing changes anywhere.
    let before = (h.effects.len(), cfg.clone());
    let e = format!("{:#}", run(&mut h, &["d.b.test"]).unwrap_err());
    assert!(
        e.contains("d.b.test stays refused by `deny = *.b.test` (.ai-sandbox/config:2)")
            && e.contains("nothing was changed"),
        "{e}"
    );
    assert_eq!(h.effects.len(), before.0, "{:?}", &h.effects[before.0..]);
    let after = h.files.iter().rev().find(|(p, _)| p.ends_with(".ai-sandbox/config")).unwrap().1.clone();
    assert_eq!(after, before.1);
}

#[test]
fn allow_in_a_directory_with_no_config_changes_nothing_and_says_how() {
    let mut h = host("", &[]);
    h.files.retain(|(p, _)| !p.ends_with(".ai-sandbox/config"));
    h.live = vec!["/run/user/1000/ai-sandbox/sessions/abc/live.json".into()];
    h.effects.clear();
    for (sub, verb) in [("allow", change::Verb::Allow), ("deny", change::Verb::Deny)] {
        let cli = Cli::try_parse_from(["ai-sandbox", sub, "b.test"]).unwrap();
        let (Some(ai_sandbox::cli::Sub::Allow(args)) | Some(ai_sandbox::cli::Sub::Deny(args))) = &cli.sub
        else {
            panic!()
        };
        let e = format!("{:#}", change::change_cmd(&mut h, args, verb).unwrap_err());
        assert!(e.contains("has no config") && e.contains("nothing was changed"), "{e}");
        assert!(
            e.contains(&format!("`ai-sandbox {sub} b.test` adds to it")) && e.contains("--session-only"),
            "{e}"
        );
        assert!(h.effects.is_empty(), "no live change, no lock, no write: {:?}", h.effects);
    }
    // Control: --session-only changes the running sandbox without a config.
    let cli = Cli::try_parse_from(["ai-sandbox", "allow", "--session-only", "b.test"]).unwrap();
    let Some(ai_sandbox::cli::Sub::Allow(args)) = &cli.sub else { panic!() };
    assert_eq!(change::change_cmd(&mut h, args, change::Verb::Allow).unwrap(), 0);
    assert!(
        h.effects.iter().any(|e| matches!(e, Effect::LiveAllow { change, .. } if change == "b.test")),
        "{:?}",
        h.effects
    );
}

#[test]
fn ps_lists_running_sandboxes_with_their_mode_and_project() {
    let mut h = host("", &[]);
    assert_eq!(sessions::ps_cmd(&mut h, false).unwrap(), 0);
    assert_eq!(h.stdout, "no sandbox is running\n");
    let rec = ai_sandbox::live::Record {
        session: "abc123".into(),
        container: "aisb-abc123".into(),
        project: "/home/dev/app".into(),
        net: ai_sandbox::policy::NetMode::Allow,
        gate: false,
        tls: false,
        host_image: true,
        logins: Vec::new(),
        policy: ai_sandbox::contract::SessionPolicy {
            gate_ports: vec![],
            config_path: String::new(),
            ..Default::default()
        },
    };
    h.running = vec![ai_sandbox::live::Running {
        session: "abc123".into(),
        pid: 4242,
        age: 125,
        record: Some(rec),
        path: "/run/user/1000/ai-sandbox/sessions/abc123/live.json".into(),
        execs: vec![ai_sandbox::live::Exec {
            pid: 5150,
            age: 3,
            command: vec!["sh".into(), "-c".into(), "sleep 9".into()],
        }],
        net_budgets: Vec::new(),
    }];
    h.stdout.clear();
    sessions::ps_cmd(&mut h, false).unwrap();
    let row = h.stdout.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>();
    assert_eq!(row, ["abc123", "4242", "2m05s", "allow", "-", "-", "/home/dev/app"], "{}", h.stdout);
    // A command `exec` runs in it, under its sandbox.
    assert_eq!(h.stdout.lines().nth(2), Some("  exec         5150      3s  sh -c sleep 9"), "{}", h.stdout);
    h.stdout.clear();
    sessions::ps_cmd(&mut h, true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&h.stdout).unwrap();
    assert_eq!(v[0]["age_seconds"], 125);
    assert_eq!(v[0]["project"], "/home/dev/app");
    assert_eq!(v[0]["execs"][0]["pid"], 5150);
    assert_eq!(v[0]["execs"][0]["command"][2], "sleep 9");
    // A learning run says so in the mode column: its hostnames are not refused.
    if let Some(rec) = h.running[0].record.as_mut() {
        rec.policy.learn = true;
    }
    h.stdout.clear();
    sessions::ps_cmd(&mut h, false).unwrap();
    let row = h.stdout.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>();
    assert_eq!(row[3], "learn", "{}", h.stdout);
    // Who holds each `state` line's login, from the launch's record.
    if let Some(rec) = h.running[0].record.as_mut() {
        rec.logins = vec!["claude: held by the gate".into(), "codex: in the agent's hands, in clear".into()];
    }
    h.stdout.clear();
    sessions::ps_cmd(&mut h, false).unwrap();
    assert!(
        h.stdout
            .contains("  login claude: held by the gate\n  login codex: in the agent's hands, in clear\n"),
        "{}",
        h.stdout
    );
    h.stdout.clear();
    sessions::ps_cmd(&mut h, true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&h.stdout).unwrap();
    assert_eq!(v[0]["logins"][0], "claude: held by the gate");
}

#[test]
fn an_image_is_never_pulled_and_a_missing_one_starts_nothing() {
    let mut h = host("image = localhost/dev:1\n", &[]);
    let dry = dry_run(&mut h, &[]);
    assert!(argv_of(&dry).contains(&"--pull=never".to_string()), "{dry}");
    h.missing_images.push("localhost/dev:1".into());
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(err.contains("never pulls") && err.contains("podman pull localhost/dev:1"), "{err}");
    assert!(h.effects.is_empty(), "nothing registered or launched: {:?}", h.effects);
    // Positive control: present, it launches (with --pull=never all the same).
    h.missing_images.clear();
    app::run(&mut h, &cli.run).unwrap();
    assert!(launched(&h).contains("--pull=never"), "{:?}", h.effects);
    // The host image has nothing to pull.
    let mut plain = host("", &[]);
    assert!(!dry_run(&mut plain, &[]).contains("--pull"));
}

#[test]
fn the_self_check_probes_a_port_no_rule_allows_and_says_when_it_cannot() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    // 45000 (the fake's first free port) is allowed: the canary is the next one.
    let mut h = host("allow = 100.64.0.1:45000\n", &[]);
    app::run(&mut h, &cli.run).unwrap();
    assert!(h.effects.contains(&Effect::Canary(Some(45001))), "{:?}", h.effects);
    let hook = &h.launched[0].hook.as_ref().unwrap().check.as_ref().unwrap().json;
    assert!(
        hook.contains("\"--canary\",\n      \"100.64.0.1:45001\"") && hook.contains("\"--gate-port\""),
        "{hook}"
    );
    // The canary proves the rules: the ruleset hook does not list the table again.
    let load = &h.launched[0].hook.as_ref().unwrap().hook_json;
    assert!(load.contains("\"--ruleset\"") && !load.contains("--confirm"), "{load}");
    // Every port of the host's loopback allowed: no probe there, and said.
    let mut all = host("allow = 100.64.0.1:1-65535\n", &[]);
    app::run(&mut all, &cli.run).unwrap();
    assert!(all.stderr.contains("the self-check has no port left to prove refused"), "{}", all.stderr);
    let check = all.launched[0].hook.as_ref().unwrap().check.as_ref().unwrap();
    assert!(!check.json.contains("--canary") && check.json.contains("--gate-port"), "{}", check.json);
    // No canary: the hook lists the table after loading it.
    assert!(all.launched[0].hook.as_ref().unwrap().hook_json.contains("\"--confirm\""));
    // Skipped for a benchmark: said at every launch, and the dry run says SKIPPED.
    let mut skip = host("", &[("AISB_SKIP_SELF_CHECK", "1")]);
    let dry = dry_run(&mut skip, &[]);
    assert!(dry.contains("# self-check: SKIPPED") && !dry.contains("--canary"), "{dry}");
    app::run(&mut skip, &cli.run).unwrap();
    assert!(skip.stderr.contains("AISB_SKIP_SELF_CHECK=1"), "{}", skip.stderr);
    assert!(!skip.effects.iter().any(|e| e.kind() == Kind::Canary), "{:?}", skip.effects);
    assert!(skip.launched[0].hook.as_ref().unwrap().hook_json.contains("\"--confirm\""));
}

#[test]
fn prune_lists_the_state_of_projects_that_are_gone_and_removes_only_when_told() {
    let mut h = host("", &[]);
    let states = "/home/dev/.local/state/ai-sandbox/projects";
    let homes = "/home/dev/.local/share/ai-sandbox/homes";
    let add = |h: &mut FakeHost, p: &str, t: &str| h.files.push((std::path::PathBuf::from(p), t.to_string()));
    // This project (it exists: its config is there), one that is gone, and one from an older
    // version with no record of its project.
    add(&mut h, &format!("{states}/old-1/project"), "/home/dev/old\n");
    add(&mut h, &format!("{states}/old-1/approved-config"), "");
    add(&mut h, &format!("{states}/old-1/reviews/abc123/review.json"), "{}");
    add(&mut h, &format!("{homes}/old-1/.bashrc"), "");
    add(&mut h, &format!("{homes}/mystery-2/.bashrc"), "");
    add(&mut h, &format!("{states}/usb-3/project"), "/media/usb/proj\n");
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    app::run(&mut h, &cli.run).unwrap();
    h.stdout.clear();
    h.effects.clear();
    // No terminal, no --yes: listed, nothing removed.
    assert_eq!(sessions::prune_cmd(&mut h, false).unwrap(), 0);
    assert!(
        h.stdout.contains("/home/dev/old (1 session change(s) that waited for review) (gone)")
            && h.stdout.contains(&format!("{homes}/old-1")),
        "{}",
        h.stdout
    );
    assert!(h.stdout.contains("kept: no record") && h.stdout.contains("mystery-2"), "{}", h.stdout);
    assert!(
        h.stdout.contains("a drive not mounted?") && h.stdout.contains("/media/usb/proj"),
        "{}",
        h.stdout
    );
    assert!(!h.stdout.contains("/home/dev/app"), "an existing project is never listed: {}", h.stdout);
    assert!(h.stdout.contains("nothing was removed") && h.effects.is_empty(), "{:?}", h.effects);
    // --yes: the gone project's state and HOME go, nothing else.
    sessions::prune_cmd(&mut h, true).unwrap();
    assert_eq!(
        h.effects,
        [Effect::Remove(format!("{states}/old-1").into()), Effect::Remove(format!("{homes}/old-1").into())]
    );
    assert!(h.files.iter().any(|(p, _)| p.starts_with(format!("{homes}/mystery-2"))));
    h.stdout.clear();
    sessions::prune_cmd(&mut h, true).unwrap();
    assert!(h.stdout.contains("nothing to prune"), "{}", h.stdout);
}

#[test]
fn the_command_starts_in_the_directory_it_was_started_from_inside_the_project() {
    let mut h = host("", &[]);
    h.cwd = "/home/dev/app/sub/deep".into();
    let argv = argv_of(&dry_run(&mut h, &[]));
    let at = argv.iter().position(|a| a == "--workdir").unwrap();
    assert_eq!(argv[at + 1], "/home/dev/app/sub/deep");
    assert!(
        argv.contains(&"/home/dev/app:/home/dev/app".to_string()),
        "the project is still what is mounted"
    );
    // Outside the project (`--project DIR` from elsewhere): the project.
    h.cwd = "/home/dev".into();
    h.stdout.clear();
    let argv = argv_of(&dry_run(&mut h, &["--project", "/home/dev/app"]));
    let at = argv.iter().position(|a| a == "--workdir").unwrap();
    assert_eq!(argv[at + 1], "/home/dev/app");
    // A --project that does not exist: said plainly, nothing planned.
    let err = format!(
        "{:#}",
        app::run(
            &mut h,
            &Cli::try_parse_from(["ai-sandbox", "--project", "/nonexistent", "--dry-run"]).unwrap().run
        )
        .unwrap_err()
    );
    assert!(err.contains("--project /nonexistent: no such directory"), "{err}");
}

#[test]
fn a_command_that_cannot_run_is_said_with_podmans_codes_before_anything_starts() {
    let run = |h: &mut FakeHost, cmd: &[&str]| {
        let cli = Cli::try_parse_from(["ai-sandbox", "--"].iter().chain(cmd)).unwrap();
        app::run(h, &cli.run).unwrap()
    };
    let mut h = host("allow = github.com\n", &[]);
    assert_eq!(run(&mut h, &["nosuchcmd", "x"]), 127);
    assert!(
        h.stderr.contains("`nosuchcmd` is not on this host's PATH")
            && h.stderr.contains("command not found; nothing was started"),
        "{}",
        h.stderr
    );
    h.files.push(("/home/dev/app/plain.sh".into(), "echo hi\n".into()));
    assert_eq!(run(&mut h, &["./plain.sh"]), 126);
    assert!(h.stderr.contains("./plain.sh: not an executable file (`chmod +x ./plain.sh`)"), "{}", h.stderr);
    assert_eq!(run(&mut h, &["./missing.sh"]), 127);
    h.files.push(("/home/dev/app/sub/file".into(), String::new()));
    assert_eq!(run(&mut h, &["./sub"]), 126);
    assert!(
        h.stderr.contains("./sub: is a directory, not a command") && !h.stderr.contains("chmod +x ./sub"),
        "{}",
        h.stderr
    );
    // Installed in ~/bin: seen only by mounting the home directory, so not at all.
    h.install("tool", "/home/dev/bin/tool");
    assert_eq!(run(&mut h, &["tool"]), 127);
    assert!(h.stderr.contains("command not found inside. To make it available, install it"), "{}", h.stderr);
    assert!(h.effects.is_empty(), "nothing registered or launched: {:?}", h.effects);
    // Positive controls: an executable script and a program on PATH launch.
    h.files.push(("/home/dev/app/run.sh".into(), "#!/bin/sh\necho hi\n".into()));
    h.exit_code = 3;
    assert_eq!(run(&mut h, &["./run.sh"]), 3);
    assert_eq!(run(&mut h, &["npm", "test"]), 3);
    // Not on the user's PATH but on the sandbox's (/usr/sbin, which a user's PATH often lacks).
    h.files.push(("/usr/sbin/nosuch-on-user-path".into(), "#!/bin/sh\n".into()));
    assert_eq!(run(&mut h, &["nosuch-on-user-path"]), 3);
    // The user's own PATH may find what the host's does not: not judged then.
    let mut own = host("env = PATH=/home/dev/app/bin:/usr/bin\n", &[]);
    assert_eq!(run(&mut own, &["nosuchcmd"]), 0);
}

#[test]
fn a_dry_run_shows_the_running_gates_port_or_says_it_is_not_known_yet() {
    let mut h = host("allow = github.com\n", &[]);
    let out = dry_run(&mut h, &[]);
    assert!(
        out.contains(
            "# note: no gate is running: a launch starts one on the first free port at or above 18081"
        ),
        "{out}"
    );
    assert!(out.contains("HTTPS_PROXY=http://aisb:SESSION-TOKEN@127.0.0.1:18081"), "{out}");
    h.gate_listening = Some(18082);
    h.stdout.clear();
    let out = dry_run(&mut h, &[]);
    assert!(!out.contains("no gate is running"), "{out}");
    assert!(
        out.contains("HTTPS_PROXY=http://aisb:SESSION-TOKEN@127.0.0.1:18082") && out.contains("-T,18082"),
        "{out}"
    );
}

#[test]
fn a_variable_passed_with_e_is_not_called_a_secret() {
    let mut h = host("secret = API_TOKEN\n", &[]);
    let cli = Cli::try_parse_from(["ai-sandbox", "-e", "NOPE", "--", "true"]).unwrap();
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0);
    assert!(
        h.stderr.contains("-e NOPE: NOPE is not set in your environment; the sandbox starts without it"),
        "{}",
        h.stderr
    );
    assert!(!h.stderr.contains("secret NOPE"), "{}", h.stderr);
    assert!(h.stderr.contains("secret API_TOKEN has no value in your environment"), "{}", h.stderr);
}

#[test]
fn inside_user_installed_tools_are_found_and_the_prompt_says_sandbox() {
    let mut h = host("", &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    let want = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/dev/.local/bin\n";
    assert!(out.contains(want), "{out}");
    assert!(argv_of(&out).windows(2).any(|w| w == ["--hostname", "ai-sandbox"]), "{out}");
    // An image keeps its own PATH; the user's PATH wins everywhere.
    let mut h = host("image = localhost/tools:1\n", &[]);
    assert!(!dry_run(&mut h, &["--", "true"]).contains("PATH="));
    let mut h = host("env = PATH=/opt/x/bin:/usr/bin\n", &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    assert!(out.contains("PATH=/opt/x/bin:/usr/bin\n") && !out.contains(".local/bin"), "{out}");
}

#[test]
fn net_none_says_nothing_about_how_rules_would_be_read_and_net_full_skips_them() {
    let cfg = "allow = github.com\nrule = github.com git-fetch\n";
    let said = "github.com: only the requests the rules allow go through";
    let mut h = host(cfg, &[]);
    assert!(dry_run(&mut h, &["--", "true"]).contains(said), "control: said with the gate");
    let mut h = host(cfg, &[]);
    let none = dry_run(&mut h, &["--net", "none", "--", "true"]);
    assert!(!none.contains(said) && none.contains("allow entry does not apply"), "{none}");
    let mut h = host(cfg, &[]);
    let full = dry_run(&mut h, &["--net", "full", "--", "true"]);
    assert!(
        full.contains("--net full: the config's rule line does not apply (no gate reads requests)"),
        "{full}"
    );
}

#[test]
fn a_published_port_only_root_may_bind_is_said_before_anything_starts() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--publish", "80", "--", "true"]).unwrap();
    let mut h = host("", &[]);
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(
        err.contains("host port 80 is below 1024, the first port a user may bind")
            && err.contains("--publish 8080:80"),
        "{err}"
    );
    assert!(h.effects.is_empty(), "{:?}", h.effects);
    // The host's own setting decides (lowered here), and the control launches.
    h.files.push(("/proc/sys/net/ipv4/ip_unprivileged_port_start".into(), "80\n".into()));
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0);
}

#[test]
fn a_published_port_already_in_use_is_said_with_who_has_it() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--publish", "8080", "--", "true"]).unwrap();
    let mut h = host("", &[]);
    h.taken_ports.push(8080);
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(
        err.contains("host port 8080 is in use (by pid 4242 (python3))")
            && err.contains("--publish 8081:8080"),
        "{err}"
    );
    assert!(h.effects.is_empty(), "{:?}", h.effects);
    h.taken_ports.clear();
    app::run(&mut h, &cli.run).unwrap();
    assert!(launched(&h).contains("127.0.0.1:8080:8080"), "control: {:?}", h.effects);
}

#[test]
fn an_argument_that_is_not_utf8_reaches_the_command_as_its_bytes() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let name = OsStr::from_bytes(b"caf\xe9 'x'.txt");
    let odd: [&OsStr; 4] = ["printf".as_ref(), "%s|".as_ref(), name, OsStr::from_bytes(b"%d\\\xff\n\n")];
    let args: Vec<&OsStr> = ["ai-sandbox".as_ref(), "--".as_ref()].into_iter().chain(odd).collect();
    let cli = Cli::try_parse_from(&args).expect("clap takes bytes after --");
    let mut h = host("", &[]);
    app::run(&mut h, &cli.run).unwrap();
    // podman's config.json cannot carry them (JSON is text): a shell script rebuilds them.
    let argv = &h.launched[0].argv;
    let tail: Vec<&str> = argv[argv.len() - 3..].iter().map(String::as_str).collect();
    assert_eq!(tail[..2], ["/bin/sh", "-c"], "{argv:?}");
    let o = std::process::Command::new("/bin/sh").args(["-c", tail[2]]).output().unwrap();
    assert_eq!(o.stdout, b"caf\xe9 'x'.txt|%d\\\xff\n\n|", "{}", tail[2]);
    // Positive control: a command in UTF-8 is passed as it is, no shell between.
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "printf", "%s|", "café 'x'.txt"]).unwrap();
    let mut h = host("", &[]);
    app::run(&mut h, &cli.run).unwrap();
    assert!(h.launched[0].argv.ends_with(&["printf".into(), "%s|".into(), "café 'x'.txt".into()]));
}

#[test]
fn a_secret_whose_value_is_not_utf8_is_refused_not_taken_for_unset() {
    let cli = Cli::try_parse_from(["ai-sandbox", "-e", "API_KEY", "--", "true"]).unwrap();
    let mut h = host("", &[]);
    h.not_text.push("API_KEY".into());
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(err.contains("the value of API_KEY in your environment is not UTF-8 text"), "{err}");
    assert!(h.launched.is_empty(), "launched with a secret dropped");
    // Positive control: the same launch with a text value starts, the value in the env file.
    let mut h = host("", &[("API_KEY", "sk-text")]);
    app::run(&mut h, &cli.run).unwrap();
    let (_, env) = h.launched[0].env_file.clone().expect("env file");
    assert!(env.contains("API_KEY=sk-text\n"), "{env}");
}

#[test]
fn a_bound_secret_is_a_placeholder_in_the_sandbox_which_then_trusts_the_gates_ca() {
    let cfg = "allow = api.example.com\nsecret = API_KEY for api.example.com\n";
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    let mut h = host(cfg, &[("API_KEY", "sk-real-value")]);
    h.files.push(("/etc/ssl/certs/ca-certificates.crt".into(), "HOST ROOTS\n".into()));
    app::run(&mut h, &cli.run).unwrap();
    let plan = &h.launched[0];
    let (_, env) = plan.env_file.clone().expect("env file");
    assert!(!env.contains("sk-real-value"), "{env}");
    assert!(env.contains("API_KEY=aisb_placeholder_"), "{env}");
    assert!(env.contains("SSL_CERT_FILE=/run/ai-sandbox/ca-bundle.pem\n"), "{env}");
    assert!(env.contains("NODE_EXTRA_CA_CERTS=/run/ai-sandbox/gate-ca.pem\n"), "{env}");
    let argv = plan.argv.join(" ");
    assert!(argv.contains("/ca-bundle.pem:/etc/ssl/certs/ca-certificates.crt:ro"), "{argv}");
    assert!(!argv.contains("sk-real-value") && !argv.contains("aisb_placeholder_"), "{argv}");
    // The host's /etc has Debian's path only: no other family's is made in it.
    assert!(!argv.contains(":/etc/pki/") && !argv.contains(":/etc/ssl/cert.pem"), "{argv}");
    // A named image gets the bundle at every family's path (Fedora/RHEL, Alpine, openSUSE).
    let mut img = host(&format!("{cfg}image = localhost/fedora-like:1\n"), &[("API_KEY", "sk-real-value")]);
    app::run(&mut img, &cli.run).unwrap();
    let argv = img.launched[0].argv.join(" ");
    for inside in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/cert.pem",
        "/etc/ssl/ca-bundle.pem",
    ] {
        assert!(argv.contains(&format!("/ca-bundle.pem:{inside}:ro")), "{inside}: {argv}");
    }
    let said = h.stderr.clone();
    assert!(said.contains("API_KEY: the sandbox holds a placeholder; the gate puts the value into HTTPS requests to api.example.com only"), "{said}");
    // The dry run shows what would happen, never the value.
    let mut h = host(cfg, &[("API_KEY", "sk-real-value")]);
    let out = dry_run(&mut h, &["--", "true"]);
    assert!(!out.contains("sk-real-value"), "{out}");
    assert!(out.contains("API_KEY=<placeholder made at launch; the gate sends <secret from $API_KEY> only to api.example.com>"), "{out}");
    assert!(out.contains("GIT_SSL_CAINFO=/run/ai-sandbox/ca-bundle.pem"), "{out}");
    // Control: unbound, the agent holds the value (and is told so), and nothing is terminated.
    let mut h = host("allow = api.example.com\nsecret = API_KEY\n", &[("API_KEY", "sk-real-value")]);
    app::run(&mut h, &cli.run).unwrap();
    let (_, env) = h.launched[0].env_file.clone().expect("env file");
    assert!(env.contains("API_KEY=sk-real-value\n") && !env.contains("SSL_CERT_FILE"), "{env}");
    assert!(h.stderr.contains("the agent holds the value of API_KEY in clear"), "{}", h.stderr);
}

#[test]
fn a_launch_stops_at_the_first_effect_that_fails_and_starts_nothing() {
    let cli = Cli::try_parse_from(["ai-sandbox", "--allow", "192.0.2.7:5432", "--", "true"]).unwrap();
    for kind in [Kind::BlockSignals, Kind::RegisterGate, Kind::Relay, Kind::Canary, Kind::Launch] {
        let mut h = host("", &[]);
        h.fails = vec![kind];
        let err = format!("{:#}", app::run(&mut h, &cli.run).expect_err(&format!("{kind:?}")));
        assert!(err.contains(&format!("{kind:?} failed")), "{kind:?}: {err}");
        assert_eq!(h.effects.last().map(Effect::kind), Some(kind), "stopped there: {:?}", h.effects);
        assert!(
            kind == Kind::Launch || !h.effects.iter().any(|e| e.kind() == Kind::Launch),
            "{kind:?} failed, yet a launch followed: {:?}",
            h.effects
        );
    }
    // Control: nothing fails, every one of them happens and the plan is launched.
    let mut h = host("", &[]);
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0);
    for kind in [Kind::BlockSignals, Kind::RegisterGate, Kind::Relay, Kind::Canary, Kind::Launch] {
        assert!(h.effects.iter().any(|e| e.kind() == kind), "{kind:?} missing: {:?}", h.effects);
    }
}

/// From a subdirectory of a repository, init writes where a launch there looks: the
/// repository's root (said), unless `--project .` names the subdirectory.
#[test]
fn init_in_a_subdirectory_of_a_repository_writes_the_projects_config() {
    let mut h = host("", &[]);
    h.files.clear();
    h.files.push(("/home/dev/app/.git/HEAD".into(), "ref: refs/heads/main\n".into()));
    h.cwd = "/home/dev/app/src/deep".into();
    assert_eq!(setup::init(&mut h, &[], false, None).unwrap(), 0);
    assert!(h.files.iter().any(|(p, _)| p == Path::new("/home/dev/app/.ai-sandbox/config")), "{:?}", h.files);
    assert!(h.stdout.contains("wrote /home/dev/app/.ai-sandbox/config (the project of /home/dev/app/src/deep: the repository's root"), "{}", h.stdout);
    // The launch from there finds that config (the control: the same project both ways).
    h.effects.clear();
    let out = dry_run(&mut h, &[]);
    assert!(!out.contains("there is no"), "{out}");
    // Named, the subdirectory is a project of its own.
    assert_eq!(setup::init(&mut h, &[], false, Some(Path::new("."))).unwrap(), 0);
    assert!(h.files.iter().any(|(p, _)| p == Path::new("/home/dev/app/src/deep/.ai-sandbox/config")));
}

#[test]
fn init_whose_write_fails_writes_nothing_else() {
    let mut h = host("", &[]);
    h.files.clear();
    h.fails = vec![Kind::Write];
    let err = format!("{:#}", setup::init(&mut h, &["pypi".to_string()], false, None).unwrap_err());
    assert!(err.contains("Write failed"), "{err}");
    assert_eq!(h.effects, [Effect::Write("/home/dev/app/.ai-sandbox/config".into())]);
    assert!(h.files.is_empty(), "nothing was written: {:?}", h.files);
}

#[test]
fn the_hosts_catatonit_is_pid_1_with_g_and_a_named_image_keeps_podmans_init() {
    // The fake host has no catatonit: podman's own --init (what the snapshots show).
    let mut plain = host("", &[]);
    let argv = argv_of(&dry_run(&mut plain, &["--", "true"]));
    assert!(argv.contains(&"--init".to_string()), "{argv:?}");
    // With it under /usr: it is the command's pid 1, forwarding signals to the process group.
    let mut h = host("", &[]);
    h.files.push(("/usr/libexec/podman/catatonit".into(), String::new()));
    let argv = argv_of(&dry_run(&mut h, &["--", "sh", "-c", "a | b"]));
    assert!(!argv.contains(&"--init".to_string()), "{argv:?}");
    let at = argv.iter().position(|a| a == "/usr/libexec/podman/catatonit").expect("catatonit in argv");
    assert_eq!(argv[at..], ["/usr/libexec/podman/catatonit", "-g", "--", "sh", "-c", "a | b"]);
    // A named image: podman composes its entrypoint with --init, so --init it stays.
    let mut named = host("image = localhost/dev:1\n", &[]);
    named.files.push(("/usr/libexec/podman/catatonit".into(), String::new()));
    let argv = argv_of(&dry_run(&mut named, &["--", "true"]));
    assert!(argv.contains(&"--init".to_string()) && !argv.contains(&"-g".to_string()), "{argv:?}");
}

/// A running sandbox of `project` as `running` reports it.
fn running(session: &str, project: &str) -> ai_sandbox::live::Running {
    ai_sandbox::live::Running {
        session: session.into(),
        pid: 4242,
        age: 5,
        record: Some(ai_sandbox::live::Record {
            session: session.into(),
            container: format!("aisb-{session}"),
            project: project.into(),
            net: ai_sandbox::policy::NetMode::Allow,
            gate: true,
            tls: false,
            host_image: true,
            logins: Vec::new(),
            policy: Default::default(),
        }),
        path: format!("/run/user/1000/ai-sandbox/sessions/{session}/live.json").into(),
        execs: Vec::new(),
        net_budgets: Vec::new(),
    }
}

fn exec_of(h: &mut FakeHost, args: &[&str]) -> anyhow::Result<i32> {
    let cli = Cli::try_parse_from(["ai-sandbox", "exec"].iter().chain(args)).unwrap();
    let Some(ai_sandbox::cli::Sub::Exec(a)) = &cli.sub else { panic!() };
    ai_sandbox::cli::exec::exec_cmd(h, a)
}

#[test]
fn exec_joins_this_projects_running_sandbox_through_podman_exec() {
    let mut h = host("", &[]);
    // None running: nothing is run, and how to start one is said.
    let err = format!("{:#}", exec_of(&mut h, &[]).unwrap_err());
    assert!(err.contains("no sandbox of /home/dev/app is running") && err.contains("`ai-sandbox`"), "{err}");
    // Another project's sandbox is not this one's.
    h.running = vec![running("other1", "/home/dev/other")];
    assert!(exec_of(&mut h, &[]).is_err());
    assert!(h.effects.is_empty(), "{:?}", h.effects);
    // One: a shell in it, from where we are, its exit code passed through.
    h.running.push(running("abc123", "/home/dev/app"));
    h.exit_code = 3;
    assert_eq!(exec_of(&mut h, &[]).unwrap(), 3);
    let Some(Effect::Exec(argv)) = h.effects.last() else { panic!("{:?}", h.effects) };
    // Recorded for `ps` under its own pid (which exec(2) hands to podman exec), before it runs.
    let record = Path::new("/run/user/1000/ai-sandbox/sessions/abc123/exec/4321");
    assert_eq!(h.effects[h.effects.len() - 2], Effect::Write(record.into()));
    let text = h.files.iter().find(|(p, _)| p == record).map(|(_, t)| t.clone()).unwrap();
    let rec: ai_sandbox::contract::execd::Execd = serde_json::from_str(&text).unwrap();
    assert_eq!((rec.container.as_str(), rec.command[0].as_str()), ("aisb-abc123", "/bin/sh"));
    assert_eq!(argv[..6], ["/usr/bin/podman", "exec", "-i", "--workdir", "/home/dev/app", "aisb-abc123"]);
    assert_eq!(argv[6..8], ["/bin/sh", "-c"], "a shell by default: {argv:?}");
    // A command, as given; a terminal gets one too.
    h.tty = true;
    exec_of(&mut h, &["--", "sh", "-c", "exit 7"]).unwrap();
    let Some(Effect::Exec(argv)) = h.effects.last() else { panic!() };
    assert_eq!(argv[2..4], ["-i", "-t"]);
    assert_eq!(argv[argv.len() - 3..], ["sh", "-c", "exit 7"]);
    // Two of this project: the one named, or an error that lists them.
    h.running.push(running("def456", "/home/dev/app"));
    let before = h.effects.len();
    let err = format!("{:#}", exec_of(&mut h, &["--", "true"]).unwrap_err());
    assert!(
        err.contains("2 sandboxes") && err.contains("abc123, def456") && err.contains("--session"),
        "{err}"
    );
    assert_eq!(h.effects.len(), before, "nothing run");
    exec_of(&mut h, &["--session", "def456", "--", "true"]).unwrap();
    let Some(Effect::Exec(argv)) = h.effects.last() else { panic!() };
    assert!(argv.contains(&"aisb-def456".to_string()), "{argv:?}");
    let err = format!("{:#}", exec_of(&mut h, &["--session", "nope", "--", "true"]).unwrap_err());
    assert!(err.contains("no running sandbox nope"), "{err}");
}

#[test]
fn review_mode_mounts_the_project_as_an_overlay_over_a_layer_in_its_state() {
    let mut h = host("workspace = review\nprotect = secrets.txt\n", &[]);
    let out = dry_run(&mut h, &["--", "true"]);
    let argv = argv_of(&out);
    let layer = argv
        .iter()
        .find(|a| a.starts_with("/home/dev/app:/home/dev/app:O,upperdir="))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        layer.contains("/.local/state/ai-sandbox/projects/app-") && layer.contains("/upper,workdir="),
        "{layer}"
    );
    assert!(!argv.iter().any(|a| a == "/home/dev/app:/home/dev/app"), "the project is not bound as well");
    assert!(
        !argv.iter().any(|a| a.ends_with(":ro") && a.starts_with("/home/dev/app/")),
        "no read-only project path: {out}"
    );
    assert!(out.contains("# note: review mode: the project is not written"), "{out}");
    // --review does the same without the key; a direct run binds the project.
    let mut h = host("", &[]);
    assert!(
        argv_of(&dry_run(&mut h, &["--review", "--", "true"])).iter().any(|a| a.contains(":O,upperdir="))
    );
    let mut h = host("", &[]);
    assert!(argv_of(&dry_run(&mut h, &["--", "true"])).iter().any(|a| a == "/home/dev/app:/home/dev/app"));
    // A value it does not know is an error on its line; a project podman's -v cannot take is refused.
    let (cfg, errs) = ai_sandbox::policy::keys::read("workspace = copy\n");
    assert!(errs.is_empty());
    let errs =
        ai_sandbox::policy::build("/w/p".into(), &cfg, &ai_sandbox::policy::Inputs::default()).unwrap_err();
    assert_eq!(errs[0].origin, ai_sandbox::error::Origin::Config(1), "{errs:?}");
    assert!(format!("{errs:?}").contains("unknown workspace `copy`"), "{errs:?}");
    let mut h = host("", &[]);
    h.cwd = "/home/dev/a,b".into();
    h.files.push(("/home/dev/a,b/.ai-sandbox/config".into(), "workspace = review\n".into()));
    let cli = Cli::try_parse_from(["ai-sandbox", "--dry-run", "--", "true"]).unwrap();
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(err.contains("review mode: the project directory /home/dev/a,b holds a `:` or `,`"), "{err}");
}

/// A fake of podman's default seccomp profile (its shape: a default action and rules by name).
const SECCOMP: &str = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"},{"names":["chroot"],"action":"SCMP_ACT_ALLOW","includes":{"caps":["CAP_SYS_CHROOT"]}}]}"#;

#[test]
fn containers_on_gives_the_sandbox_its_engine_and_its_containers_the_gate() {
    let mut h = host("allow = registry.example\ncontainers = on\n", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    let out = dry_run(&mut h, &["--", "pytest"]);
    let argv = argv_of(&out);
    let at = |s: &str| argv.iter().position(|a| a == s).unwrap_or_else(|| panic!("{s} in {argv:?}"));
    assert!(argv.contains(&"unmask=ALL".to_string()) && argv.contains(&"no-new-privileges".to_string()));
    assert!(
        argv.iter().any(|a| a.starts_with("seccomp=") && a.ends_with("/engine-seccomp.json")),
        "{argv:?}"
    );
    assert_eq!(argv[at("--device") + 1], "/dev/net/tun");
    assert_eq!(&argv[argv.len() - 4..], ["/run/ai-sandbox/ai-sandbox", "engine", "--", "pytest"]);
    insta::assert_snapshot!(out);
}

#[test]
fn containers_on_with_net_none_has_no_proxy_for_its_containers() {
    let mut h = host("", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    let out = dry_run(&mut h, &["--containers", "--net", "none", "--", "make", "test"]);
    let conf = out
        .split("/engine/containers.conf (in /run/ai-sandbox/engine inside)")
        .nth(1)
        .expect("the engine's containers.conf is shown");
    let conf = conf.split("\n\n# /").next().unwrap();
    assert!(!conf.contains("PROXY") && conf.contains("pasta_options"), "{conf}");
    assert!(out.contains("DOCKER_HOST=unix:///tmp/ai-sandbox-engine/podman/podman.sock"), "{out}");
    // The control: without --containers, no engine is planned at all.
    let mut h = host("", &[]);
    let plain = dry_run(&mut h, &["--net", "none", "--", "make", "test"]);
    assert!(
        !plain.contains("engine") && !plain.contains("DOCKER_HOST") && !plain.contains("unmask"),
        "{plain}"
    );
}

#[test]
fn containers_on_needs_podmans_seccomp_profile() {
    let mut h = host("containers = on\n", &[]);
    let cli = Cli::try_parse_from(["ai-sandbox", "--dry-run"]).unwrap();
    let err = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(
        err.contains("/usr/share/containers/seccomp.json") && err.contains("nothing was started"),
        "{err}"
    );
    // The control: with the profile there, the same config plans.
    let mut h = host("containers = on\n", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    assert!(dry_run(&mut h, &[]).contains("engine-seccomp.json"));
}

#[test]
fn image_share_feeds_the_image_to_a_sandbox_of_the_project_that_loads_it_offline() {
    let mut h = host("", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    let cli = Cli::try_parse_from(["ai-sandbox", "image", "share", "localhost/pg:16"]).unwrap();
    let Some(ai_sandbox::cli::Sub::Image { cmd: ai_sandbox::cli::ImageCmd::Share { image, project } }) =
        cli.sub
    else {
        panic!("parsed as image share")
    };
    assert_eq!(ai_sandbox::cli::image::share_cmd(&mut h, &image, project.as_deref()).unwrap(), 0);
    // The image goes in through the launch's standard input, then the engine loads it offline.
    assert!(matches!(&h.effects[0], Effect::FeedImage(i) if i == "localhost/pg:16"), "{:?}", h.effects);
    let argv = launched(&h);
    assert!(
        argv.contains("--network none")
            && argv.contains("engine -- sh -c ")
            && argv.contains("podman load -q"),
        "{argv}"
    );
    assert!(h.stderr.contains("localhost/pg:16 is in this project's sandbox engine now"), "{}", h.stderr);
    // An image the host does not have: nothing is fed or launched.
    let mut h = host("", &[]);
    h.missing_images.push("localhost/nope".into());
    let err = ai_sandbox::cli::image::share_cmd(&mut h, "localhost/nope", None).unwrap_err();
    assert!(format!("{err:#}").contains("there is no image `localhost/nope`"), "{err:#}");
    assert!(h.effects.is_empty(), "{:?}", h.effects);
}

#[test]
fn containers_on_leaves_docker_host_and_the_reaper_to_a_user_who_sets_them() {
    let mut h = host("containers = on\nenv = DOCKER_HOST=tcp://127.0.0.1:2375\n", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    let out = dry_run(&mut h, &["-e", "TESTCONTAINERS_RYUK_DISABLED=false", "--", "true"]);
    let env: Vec<&str> =
        out.lines().filter(|l| l.starts_with("DOCKER_HOST=") || l.starts_with("TESTCONTAINERS_")).collect();
    assert_eq!(env, ["DOCKER_HOST=tcp://127.0.0.1:2375", "TESTCONTAINERS_RYUK_DISABLED=false"], "{out}");
    // The control: unset by the user, both are ai-sandbox's.
    let mut h = host("containers = on\n", &[]);
    h.files.push(("/usr/share/containers/seccomp.json".into(), SECCOMP.into()));
    let out = dry_run(&mut h, &["--", "true"]);
    let env: Vec<&str> =
        out.lines().filter(|l| l.starts_with("DOCKER_HOST=") || l.starts_with("TESTCONTAINERS_")).collect();
    assert_eq!(
        env,
        ["DOCKER_HOST=unix:///tmp/ai-sandbox-engine/podman/podman.sock", "TESTCONTAINERS_RYUK_DISABLED=true"],
        "{out}"
    );
}

/// A host with no IPv4 default route (offline) gives pasta its local addresses explicitly, so the
/// sandbox can reach the gate's address; a host with one (and a host whose routes were not read)
/// leaves pasta to copy the host's.
#[test]
fn an_offline_host_gives_pasta_its_local_addresses() {
    let network = |routes: Option<&str>| {
        let mut h = host(DESIGN_CONFIG, &[]);
        if let Some(r) = routes {
            h.files.push(("/proc/net/route".into(), r.into()));
        }
        let argv = argv_of(&dry_run(&mut h, &[]));
        argv[argv.iter().position(|a| a == "--network").unwrap() + 1].clone()
    };
    let header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
    let offline = format!("{header}wlan0\t0000A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0\n");
    let online = format!(
        "{header}wlan0\t00000000\t0100A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n{}",
        &offline[header.len()..]
    );
    assert!(
        network(Some(&offline)).contains(",-a,169.254.2.1,-n,30,-g,169.254.2.2"),
        "{}",
        network(Some(&offline))
    );
    assert!(!network(Some(&online)).contains("169.254.2"), "{}", network(Some(&online)));
    assert!(!network(None).contains("169.254.2"), "routes not read: nothing changes");
    assert!(network(Some(header)).contains("-a,169.254.2.1"), "no route at all: offline too");
}

/// The host's git identity (user.name and user.email only) authors commits inside, as git's
/// variables in the env file, said at launch; `git_identity = off` and `Name <email>` say
/// otherwise; a variable the user set wins.
#[test]
fn commits_inside_are_authored_by_the_users_git_identity_unless_the_config_says_otherwise() {
    let env_of = |config: &str, identity: Option<(&str, &str)>| {
        let mut h = host(config, &[]);
        h.git_identity = identity.map(|(n, e)| (n.to_string(), e.to_string()));
        let out = dry_run(&mut h, &[]);
        let env = out.split("(mode 0600").nth(1).unwrap_or_default().to_string();
        (out, env)
    };
    let (out, env) = env_of("", Some(("Dev One", "dev@example.com")));
    for v in [
        "GIT_AUTHOR_NAME=Dev One\n",
        "GIT_AUTHOR_EMAIL=dev@example.com\n",
        "GIT_COMMITTER_NAME=Dev One\n",
        "GIT_COMMITTER_EMAIL=dev@example.com\n",
    ] {
        assert!(env.contains(v), "{v:?}: {env}");
    }
    assert!(
        out.contains(
            "# note: git commits inside are authored by Dev One <dev@example.com> (your git config's"
        ),
        "{out}"
    );
    let (out, env) = env_of("git_identity = off\n", Some(("Dev One", "dev@example.com")));
    assert!(!env.contains("GIT_AUTHOR") && !out.contains("authored by"), "{out}");
    let (_, env) = env_of("git_identity = Agent <agent@example.com>\n", None);
    assert!(
        env.contains("GIT_AUTHOR_NAME=Agent\n") && env.contains("GIT_COMMITTER_EMAIL=agent@example.com\n"),
        "{env}"
    );
    let (_, env) = env_of("env = GIT_AUTHOR_NAME=Mine\n", Some(("Dev One", "dev@example.com")));
    assert!(
        env.contains("GIT_AUTHOR_NAME=Mine\n")
            && !env.contains("GIT_AUTHOR_NAME=Dev One")
            && env.contains("GIT_COMMITTER_NAME=Dev One"),
        "{env}"
    );
    // No identity on the host: nothing set, nothing said.
    let (out, env) = env_of("", None);
    assert!(!env.contains("GIT_AUTHOR") && !out.contains("authored by"), "{out}");
}

/// A full runtime directory stops a launch before anything starts (no gate, no session files),
/// naming the directory and what to do; a dry run still plans.
#[test]
fn a_full_runtime_directory_starts_nothing_and_says_which_and_why() {
    let mut h = host("allow = a.test\n", &[]);
    h.free = Some(1000);
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    let e = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(
        e.contains("the runtime directory /run/user/1000/ai-sandbox has 1000 bytes free")
            && e.contains("nothing was started"),
        "{e}"
    );
    assert!(e.contains("du -sh /run/user/1000/ai-sandbox/*"), "{e}");
    assert!(
        !h.effects.iter().any(|x| matches!(x.kind(), Kind::Launch | Kind::RegisterGate)),
        "{:?}",
        h.effects
    );
    // Control: with room, the same launch goes ahead.
    h.free = Some(1 << 30);
    assert_eq!(app::run(&mut h, &cli.run).unwrap(), 0);
}

#[test]
fn secret_aws_gives_the_sandbox_placeholders_and_says_the_gate_signs() {
    let cfg = "allow = bedrock-runtime.us-east-1.amazonaws.com\nsecret = aws for bedrock-runtime.us-east-1.amazonaws.com\n";
    let creds = [("AWS_ACCESS_KEY_ID", "AKIAREALKEYID"), ("AWS_SECRET_ACCESS_KEY", "real/secret+key")];
    let cli = Cli::try_parse_from(["ai-sandbox", "--", "true"]).unwrap();
    let mut h = host(cfg, &creds);
    app::run(&mut h, &cli.run).unwrap();
    let (_, env) = h.launched[0].env_file.clone().expect("env file");
    assert!(!env.contains("AKIAREALKEYID") && !env.contains("real/secret+key"), "{env}");
    for var in ["AWS_ACCESS_KEY_ID=aisb_placeholder_", "AWS_SECRET_ACCESS_KEY=aisb_placeholder_"] {
        assert!(env.contains(var), "{var} in {env}");
    }
    assert!(!env.contains("AWS_SESSION_TOKEN"), "long-term keys have no session token: {env}");
    let said = "secret = aws: the gate holds your AWS credentials (from your environment) and signs the requests to \
                bedrock-runtime.us-east-1.amazonaws.com that the sandbox signed with its placeholders \
                (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); they go nowhere else";
    assert!(h.stderr.contains(said), "{}", h.stderr);
    assert!(
        !h.stderr.contains("AWS_SECRET_ACCESS_KEY: the sandbox holds a placeholder"),
        "said once: {}",
        h.stderr
    );
    // A profile of the credentials file, with its session token; the environment's keys are not it.
    let text = "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = d\n[work]\n\
                aws_access_key_id = ASIAWORK\naws_secret_access_key = w\naws_session_token = tok\n";
    let mut h = host(&cfg.replace("aws for", "aws:work for"), &creds);
    h.files.push(("/home/dev/.aws/credentials".into(), text.into()));
    app::run(&mut h, &cli.run).unwrap();
    let (_, env) = h.launched[0].env_file.clone().expect("env file");
    assert!(env.contains("AWS_SESSION_TOKEN=aisb_placeholder_") && !env.contains("tok\n"), "{env}");
    assert!(h.stderr.contains("(from /home/dev/.aws/credentials [work])"), "{}", h.stderr);
    // None anywhere: nothing starts, and the error says where it looked and what to do.
    let mut h = host(cfg, &[]);
    let e = format!("{:#}", app::run(&mut h, &cli.run).unwrap_err());
    assert!(e.contains("no AWS credentials") && e.contains("aws configure export-credentials"), "{e}");
    assert!(h.launched.is_empty());
    // The dry run reads nothing and says where it would.
    let mut h = host(cfg, &creds);
    let out = dry_run(&mut h, &["--", "true"]);
    assert!(!out.contains("AKIAREALKEYID") && !out.contains("real/secret+key"), "{out}");
    let would = "the gate signs with <AWS_SECRET_ACCESS_KEY from AWS_ACCESS_KEY_ID in your environment, else \
                 /home/dev/.aws/credentials [default]>";
    assert!(out.contains(would), "{out}");
    assert!(!out.contains("is not an AWS service endpoint"), "{out}");
    // A host that is not AWS's is said; control: the AWS one above was not.
    let odd = "allow = s3.example.com\nsecret = aws for s3.example.com\n";
    let out = dry_run(&mut host(odd, &creds), &["--", "true"]);
    assert!(out.contains("secret = aws: s3.example.com is not an AWS service endpoint"), "{out}");
    let api = "allow = abc.execute-api.us-east-1.amazonaws.com\nsecret = aws for abc.execute-api.us-east-1.amazonaws.com\n";
    let out = dry_run(&mut host(api, &creds), &["--", "true"]);
    assert!(out.contains("abc.execute-api.us-east-1.amazonaws.com is not an AWS service endpoint"), "{out}");
    // One -e for one of the three drops the line whole: nothing is half signed.
    let cli = Cli::try_parse_from(["ai-sandbox", "-e", "AWS_ACCESS_KEY_ID", "--", "true"]).unwrap();
    let mut h = host(cfg, &creds);
    app::run(&mut h, &cli.run).unwrap();
    let (_, env) = h.launched[0].env_file.clone().expect("env file");
    assert!(
        env.contains("AWS_ACCESS_KEY_ID=AKIAREALKEYID") && !env.contains("AWS_SECRET_ACCESS_KEY"),
        "{env}"
    );
    assert!(!h.stderr.contains("the gate holds your AWS credentials"), "{}", h.stderr);
}
