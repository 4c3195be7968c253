//! Table-driven: every malformed config line makes the real binary exit non-zero, start
//! nothing (empty stdout), and name the line as `.ai-sandbox/config:LINE:`.

use std::path::Path;
use std::process::Command;

fn run_with_config(dir: &Path, config: &str, extra: &[&str]) -> std::process::Output {
    std::fs::create_dir_all(dir.join(".ai-sandbox")).unwrap();
    std::fs::write(dir.join(".ai-sandbox/config"), config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ai-sandbox"))
        .arg("--dry-run")
        .args(extra)
        .current_dir(dir)
        .env_remove("AISB_EXTRA_ARGS")
        .output()
        .unwrap()
}

const BAD_LINES: &[&str] = &[
    "allow = bad host",
    "allow = *",
    "allow = *.com",
    "allow = *.co.uk",
    "allow = http://x.com",
    "allow = a..b",
    "allow = 1.2.3.4/33",
    "allow = 1.2.3.4/24",
    "allow = 1.2.3.4:0",
    "allow = 1.2.3.4:65536",
    "allow = 1.2.3.4:99999",
    "allow = github.com/x",
    "allow = user@github.com",
    "allow = 127.0.0.1:22",
    "allow = 0x7f000001",
    "allow = 0.0.0.0/0",
    "allow = [::1]:22",
    "alow = github.com",
    "allow =",
    "allow",
    "net = sometimes",
    "gate_port = 80",
    "gate_port = 99999",
    "gate_addr = 127.0.0.1",
    "gate_ports = 80-90",
    "gate_ports = 80,http",
    "gate_addr = not-an-ip",
    "publish = 0",
    "publish = 8000-8001",
    "publish = 8000:abc",
    "env = NOVALUE",
    "env = 1BAD=x",
    "env = HTTP_PROXY=http://other:3128",
    "cmd = 'unbalanced",
    "extra_args = --network=host",
    "extra_args = --cap-add NET_ADMIN",
    "image = -v",
    "colour = blue",
];

#[test]
fn each_bad_line_is_reported_with_its_line_number_and_nothing_starts() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(BAD_LINES.len() >= 25);
    for (i, line) in BAD_LINES.iter().enumerate() {
        let dir = tmp.path().join(format!("p{i}"));
        // Line 1 is a comment so the bad line is line 2.
        let out = run_with_config(&dir, &format!("# project\n{line}\n"), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{line:?} was accepted");
        assert!(stderr.contains(".ai-sandbox/config:2: "), "{line:?}: stderr was {stderr}");
        assert!(stderr.contains("hint: "), "{line:?}: no hint in {stderr}");
        assert!(out.stdout.is_empty(), "{line:?}: something was planned");
    }
}

#[test]
fn duplicate_single_keys_name_both_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with_config(tmp.path(), "gate_port = 18081\ngate_port = 18082\n", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(".ai-sandbox/config:2: duplicate `gate_port` (already set on line 1)"),
        "{stderr}"
    );
}

#[test]
fn every_bad_line_is_reported_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with_config(
        tmp.path(),
        "allow = *\nallow = github.com\nnet = maybe\nalow = x\n",
        &["--allow", "a..b"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in [
        ".ai-sandbox/config:1:",
        ".ai-sandbox/config:3:",
        ".ai-sandbox/config:4:",
        "--allow: bad allow entry",
        "4 problems found; nothing was started",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in {stderr}");
    }
    assert!(!stderr.contains("config:2:"), "a good line was reported: {stderr}");
}

#[test]
fn a_good_config_is_accepted_as_a_positive_control() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with_config(tmp.path(), "allow = github.com\nallow = 100.64.0.1:5432\n", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("100.64.0.1 . 5432"));
}
