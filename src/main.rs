//! Entry point: parse the command line and dispatch. Errors are printed once, here.

use ai_sandbox::cli::{Cli, Sub};
use ai_sandbox::host::RealHost;
use ai_sandbox::{app, hook, keeper};
use clap::Parser;

fn main() {
    let cli = Cli::parse();
    let mut host = RealHost::default();
    let result = match &cli.sub {
        None => app::run(&mut host, &cli.run),
        Some(Sub::Rules { run, json, nft: _ }) => app::rules(&mut host, run, *json),
        Some(Sub::Doctor) => ai_sandbox::doctor::run(),
        Some(Sub::Hook { nft, ruleset }) => hook::run(nft, ruleset),
        Some(Sub::Keeper { session_dir, name, podman }) => keeper::run(session_dir, name, podman),
        Some(Sub::Gate { cmd }) => ai_sandbox::gate::commands::run(cmd),
        Some(Sub::Init { presets, force, project }) => {
            app::init(&mut host, presets, *force, project.as_deref())
        }
        Some(Sub::Completions { shell }) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "ai-sandbox", &mut std::io::stdout());
            Ok(0)
        }
        Some(Sub::Man) => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout()).map(|_| 0).map_err(Into::into)
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
