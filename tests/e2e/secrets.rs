//! Secrets reach the sandbox's environment and nothing else: not a command line any local user
//! can read in /proc, not the gate's or the keepers' logs. Positive control: the values arrive.

use crate::harness::*;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn secret_values_are_in_the_sandbox_and_on_no_command_line_or_log() {
    let p = Project::new("secrets");
    let (api, envd, filed) = ("sk-e2e-API-4f1c9a7d2b", "env-e2e-SECRET-77aa01", "file-e2e-SECRET-9c3e55");
    let file = env().root.join(format!("secret-{}", std::process::id()));
    std::fs::write(&file, format!("{filed}\n")).unwrap();
    chown_user(&file);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p.config(&format!(
        "secret = FROM_ENV\nsecret = FROM_FILE from {}\nallow = 100.64.0.1:9\n",
        file.display()
    ));
    let script = format!(
        "printf '%s %s %s' \"$API_KEY\" \"$FROM_ENV\" \"$FROM_FILE\" > seen; touch ready; {UNTIL_DONE}"
    );
    let child = spawn_sandbox_with_secret_env(
        &p,
        &["-e", "API_KEY", "--", "sh", "-c", &script],
        &[("API_KEY", api), ("FROM_ENV", envd)],
    );
    assert!(wait_for(60, || p.path("ready").exists()), "sandbox did not start");
    // While it runs: every process's command line on this machine.
    let leaks = command_lines_containing(&[api, envd, filed]);
    finish(&p, child);
    assert!(leaks.is_empty(), "a secret on a command line: {leaks:?}");
    assert_eq!(
        std::fs::read_to_string(p.path("seen")).unwrap(),
        format!("{api} {envd} {filed}"),
        "the values arrive"
    );
    let logs = format!(
        "{}{}",
        gate_log(),
        std::fs::read_to_string(sessions_dir().with_file_name("keeper.log")).unwrap_or_default()
    );
    for s in [api, envd, filed] {
        assert!(!logs.contains(s), "a secret in a log");
    }
    // A secret file others can read is refused, and nothing starts.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let r = sandbox(&p, &["--", "touch", "ran"], &[("FROM_ENV", "not-secret-here")]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("readable by others") && r.stderr.contains("chmod 600"), "{}", r.stderr);
    assert!(!p.path("ran").exists());
}
