//! Snapshot tests of the whole pure pipeline (config + CLI + env → Plan → `--dry-run` text),
//! driven through `FakeHost`, which also proves that a dry run asks for no side effect.

use ai_sandbox::app;
use ai_sandbox::cli::Cli;
use ai_sandbox::host::FakeHost;
use clap::Parser;
use std::path::PathBuf;

/// The project's founding example config, every kind of line.
const DESIGN_CONFIG: &str = "\
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

fn host(config: &str, vars: &[(&str, &str)]) -> FakeHost {
    let mut h = FakeHost { cwd: PathBuf::from("/home/dev/app"), uid: 1000, ..FakeHost::default() };
    h.vars.push(("HOME".into(), "/home/dev".into()));
    h.vars.push(("XDG_RUNTIME_DIR".into(), "/run/user/1000".into()));
    h.vars.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    h.files.push(("/home/dev/app/.ai-sandbox/config".into(), config.into()));
    h
}

/// The podman argv printed by `--dry-run`, parsed back as a shell would.
fn argv_of(out: &str) -> Vec<String> {
    let cmd: Vec<&str> =
        out.lines().skip_while(|l| l.starts_with('#')).take_while(|l| !l.is_empty()).collect();
    shlex::split(&cmd.join("\n").replace(" \\\n", " ")).expect("the printed command parses as shell words")
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
    let out = dry_run(&mut h, &["--", "true"]);
    let args = argv_of(&out);
    let pos = |a: &str| args.iter().position(|x| x == a).unwrap_or_else(|| panic!("{a} missing"));
    assert!(pos("--http-proxy=false") < pos("--memory"), "ours first");
    assert!(pos("2g") < pos("/cache:/cache:ro"), "config before AISB_EXTRA_ARGS");
    assert!(pos("512") < pos("--rootfs"), "all options before the rootfs positional");
    insta::assert_snapshot!(out);
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
    assert_eq!(h.effects.len(), 2, "{:?}", h.effects);
    assert_eq!(
        h.effects[0], "register gate from port 18081",
        "the gate is registered before the plan is built"
    );
    assert!(h.effects[1].contains("run --rm -i"));
    // The proxy URL (with the token) is not on the command line: `ps` would show it.
    let token = "ab".repeat(16);
    assert!(!h.effects[1].contains(&token), "token on argv: {}", h.effects[1]);
    assert!(h.effects[1].contains("--env-file /run/user/1000/ai-sandbox/sessions/abababababab/proxy.env"));

    let mut root = host("", &[]);
    root.uid = 0;
    let err = app::run(&mut root, &cli.run).unwrap_err().to_string();
    assert!(err.contains("rootless") && err.contains("scripts/as-user"), "{err}");
    assert!(root.effects.is_empty());
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
}

#[test]
fn ruleset_and_proxy_url_use_the_gates_actual_port() {
    let (cfg, errs) = ai_sandbox::config::parse("gate_port = 18081\n");
    assert!(errs.is_empty());
    let p = ai_sandbox::policy::build("/w/p".into(), &cfg, &ai_sandbox::policy::Inputs::default()).unwrap();
    let mut h = host("", &[]);
    let mut facts = app::gather_facts(&mut h, &p, false).unwrap();
    facts.gate_port = 20000;
    let plan = ai_sandbox::plan::build(&p, &facts);
    let text = plan.ruleset.unwrap().to_text();
    assert!(text.contains("ip daddr 100.64.0.1 tcp dport 20000 accept"), "{text}");
    assert!(!text.contains("18081"), "{text}");
    let (_, env) = plan.env_file.expect("proxy env file");
    assert!(env.contains("HTTPS_PROXY=http://aisb:SESSION-TOKEN@100.64.0.1:20000\n"), "{env}");
    assert!(!plan.argv.iter().any(|a| a.contains("SESSION-TOKEN")), "{:?}", plan.argv);
}

#[test]
fn init_writes_the_config_and_never_overwrites_without_force() {
    let mut h = host("", &[]);
    h.files.clear();
    let presets = vec!["claude".to_string(), "npm".to_string()];
    assert_eq!(app::init(&mut h, &presets, false, None).unwrap(), 0);
    assert_eq!(h.effects, ["write /home/dev/app/.ai-sandbox/config"]);
    let written = h.files[0].1.clone();
    assert!(written.contains("allow = api.anthropic.com\n") && written.contains("cmd = claude\n"));
    let err = app::init(&mut h, &["pypi".to_string()], false, None).unwrap_err().to_string();
    assert!(err.contains("already exists") && err.contains("--force"), "{err}");
    assert_eq!(h.effects.len(), 1, "nothing written the second time");
    assert_eq!(h.files[0].1, written, "the existing config is untouched");
    app::init(&mut h, &["pypi".to_string()], true, None).unwrap();
    assert!(h.files[0].1.contains("allow = pypi.org"));
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
    assert!(h.effects.iter().any(|e| e == "probe 127.0.0.1:6379"));
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
