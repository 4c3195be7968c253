//! Entry point: parse the command line and dispatch. Errors are printed once, here.
//!
//! No `unsafe` here: what needs it is in the library's `sys` (see lib.rs).

#![deny(unsafe_code)]

use ai_sandbox::cli::{Cli, Sub};
use ai_sandbox::cli::{app, change, export, sessions, setup};
use ai_sandbox::host::RealHost;
use ai_sandbox::{launch::hook, launch::keeper};
use clap::Parser;

fn main() {
    // `ai-sandbox help config`: the config's keys (clap's `help` knows only the commands).
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if raw.len() == 2 && raw[0] == "help" && raw[1] == "config" {
        end_quietly_on_a_closed_pipe();
        print!("{}", ai_sandbox::cli::manpage::config_help());
        std::process::exit(0);
    }
    // `ai-sandbox help config-example`: the commented example of every key, from the binary.
    if raw.len() == 2 && raw[0] == "help" && raw[1] == "config-example" {
        end_quietly_on_a_closed_pipe();
        print!("{}", ai_sandbox::cli::manpage::CONFIG_EXAMPLE);
        std::process::exit(0);
    }
    let cli = Cli::try_parse().unwrap_or_else(|e| usage_error(e));
    if prints_for_a_reader(&cli) {
        end_quietly_on_a_closed_pipe();
    }
    let mut host = RealHost::default();
    let result = match &cli.sub {
        None => app::run(&mut host, &cli.run),
        Some(Sub::Rules { policy, json, nft: _ }) => app::rules(&mut host, policy, *json),
        Some(Sub::Export { cmd }) => export::export_cmd(&mut host, cmd),
        Some(Sub::Doctor) => ai_sandbox::cli::doctor::run(),
        Some(Sub::Hook { nft, ruleset, confirm }) => hook::run(nft, ruleset, *confirm),
        Some(Sub::SelfCheck { canary, gate_port }) => {
            hook::self_check(&hook::SelfCheck { canary: *canary, gate_port: *gate_port })
        }
        Some(Sub::Keeper { session_dir, guard, name, podman }) => {
            keeper::run(session_dir, guard, name, podman)
        }
        Some(Sub::Engine { command }) => ai_sandbox::launch::engine::run(command),
        Some(Sub::Connect { host, port }) => ai_sandbox::gate::connect::run(host, *port),
        Some(Sub::Trust { show, project }) => setup::trust_cmd(&mut host, project.as_deref(), *show),
        Some(Sub::Ps { json }) => sessions::ps_cmd(&mut host, *json),
        Some(Sub::Report { project }) => sessions::report_cmd(&mut host, project.as_deref()),
        Some(Sub::Prune { yes }) => sessions::prune_cmd(&mut host, *yes),
        Some(Sub::Watch) => ai_sandbox::cli::watch::run(),
        Some(Sub::Logs { denied, session, all, follow, json, format }) => {
            use ai_sandbox::cli::logs::Scope;
            let scope = match (session, all) {
                (Some(s), _) => Scope::Session(s.clone()),
                (None, true) => Scope::All,
                (None, false) => Scope::Project(ai_sandbox::config::project::find(
                    &std::env::current_dir().unwrap_or_default(),
                    |p| p.exists(),
                )),
            };
            let format = if *json { ai_sandbox::cli::logs::Format::Json } else { *format };
            ai_sandbox::cli::logs::run(*denied, &scope, *follow, format)
        }
        Some(Sub::Exec(args)) => ai_sandbox::cli::exec::exec_cmd(&mut host, args),
        Some(Sub::Learn(args)) => ai_sandbox::cli::learn::learn_cmd(&mut host, args),
        Some(Sub::Diff { session, stat, which }) => {
            ai_sandbox::cli::review::diff_cmd(&mut host, which, session.as_deref(), *stat)
        }
        Some(Sub::Apply { args, branch, which }) => {
            ai_sandbox::cli::review::apply_cmd(&mut host, which, args, branch.as_deref())
        }
        Some(Sub::Discard { session, which }) => {
            ai_sandbox::cli::review::discard_cmd(&mut host, which, session.as_deref())
        }
        Some(Sub::Allow(args)) => change::change_cmd(&mut host, args, change::Verb::Allow),
        Some(Sub::Deny(args)) => change::change_cmd(&mut host, args, change::Verb::Deny),
        Some(Sub::Login { cmd: ai_sandbox::cli::LoginCmd::Import { agent } }) => {
            setup::login_import(&mut host, agent)
        }
        Some(Sub::Image { cmd: ai_sandbox::cli::ImageCmd::Share { image, project } }) => {
            ai_sandbox::cli::image::share_cmd(&mut host, image, project.as_deref())
        }
        Some(Sub::Gate { cmd }) => ai_sandbox::gate::commands::run(cmd),
        Some(Sub::Init { presets, force, project }) => {
            setup::init(&mut host, presets, *force, project.as_deref())
        }
        Some(Sub::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "ai-sandbox", &mut std::io::stdout());
            Ok(0)
        }
        Some(Sub::Man) => {
            ai_sandbox::cli::manpage::render(&mut std::io::stdout()).map(|_| 0).map_err(Into::into)
        }
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ai-sandbox: {e:#}");
            std::process::exit(125);
        }
    }
}

/// `ai-sandbox logs | head -1`: end quietly when the reader goes away, as cat and git do,
/// instead of panicking on the broken pipe. Only for commands that print for a reader (see
/// `prints_for_a_reader`): a peer that hangs up must not kill a process that serves.
fn end_quietly_on_a_closed_pipe() {
    ai_sandbox::sys::process::default_sigpipe();
}

/// Commands whose output is for a reader (a pager, `head`) and that change nothing a signal
/// could leave half-done: not the processes that serve, nor `allow`/`deny` (nft, then the gate).
fn prints_for_a_reader(cli: &Cli) -> bool {
    use ai_sandbox::gate::commands::GateCmd;
    match &cli.sub {
        None => cli.run.dry_run,
        Some(Sub::Gate { cmd }) => matches!(cmd, GateCmd::Logs { .. } | GateCmd::Status { .. }),
        Some(
            Sub::Logs { .. }
            | Sub::Man
            | Sub::Completions { .. }
            | Sub::Rules { .. }
            | Sub::Export { .. }
            | Sub::Ps { .. }
            | Sub::Diff { .. }
            | Sub::Doctor,
        ) => true,
        Some(_) => false,
    }
}

/// clap's message, plus the hint a newcomer needs most: a command to run goes after `--`.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    // args_os: an argument that is not UTF-8 (the very thing clap may be refusing) must not panic.
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    let first_word = args.iter().find(|a| !a.starts_with('-'));
    // Not when clap has the right hint already (`--alow`: "a similar argument exists"), nor for a
    // word of ai-sandbox's own (`export docker` is a mistyped export, not a command to run).
    use clap::error::ContextKind;
    let suggested =
        e.get(ContextKind::SuggestedArg).is_some() || e.get(ContextKind::SuggestedSubcommand).is_some();
    let ours =
        first_word.is_some_and(|w| <Cli as clap::CommandFactory>::command().find_subcommand(w).is_some());
    let bare_command = matches!(e.kind(), ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand)
        && first_word.is_some()
        && !suggested
        && !ours;
    if e.kind() == ErrorKind::InvalidUtf8 {
        // clap does not say which; the first one that is not text is the one to fix.
        let raw = std::env::args_os().skip(1).find(|a| a.to_str().is_none()).unwrap_or_default();
        eprintln!(
            "ai-sandbox: the argument {} is not UTF-8 text\n  hint: ai-sandbox's own options and values are text; only the command after `--` may carry any bytes (`ai-sandbox -- ls $'caf\\xe9.txt'`)",
            ai_sandbox::plan::quote(&raw)
        );
        std::process::exit(125);
    }
    let _ = e.print();
    if bare_command {
        eprintln!(
            "\n  hint: to run a command in the sandbox, put it after `--`: ai-sandbox -- {}",
            args.join(" ")
        );
    }
    std::process::exit(if e.use_stderr() { 125 } else { 0 });
}
