//! `ai-sandbox init [--preset NAME]...`: writes a starting `.ai-sandbox/config` from presets.
//! Rendering is pure (snapshot-tested); the command refuses to overwrite without `--force`.

use crate::error::{Hinted, hinted};

/// (name, what it is for, config lines). Agent presets list the hosts the real CLI contacts for
/// its core work, as measured with the real CLIs against a fake model API (reported in the
/// project's issue tracker, November 2026); optional hosts are commented out with what they are
/// for, and env lines silence what is not needed.
const PRESETS: &[(&str, &str, &[&str])] = &[
    (
        "claude",
        "Claude Code (measured with 2.1.332: it talks only to api.anthropic.com)",
        &[
            "allow = api.anthropic.com",
            "env = CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1   # no telemetry, error reports or update checks",
            "# secret = ANTHROPIC_API_KEY for api.anthropic.com # an API key the agent never holds (it sees a placeholder); or log in inside",
            "state = claude                                     # the login follows you across projects (not your real ~/.claude; settings stay per project)",
            "cmd = claude",
        ],
    ),
    (
        "codex",
        "OpenAI Codex CLI (measured with 0.171.0: api.openai.com, over a WebSocket first; chatgpt.com for models, plugins and ChatGPT login)",
        &[
            "allow = api.openai.com",
            "allow = chatgpt.com",
            "# allow = ab.chatgpt.com                           # metrics",
            "# allow = github.com                               # plugins",
            "# allow = api.github.com                           # plugins",
            "# secret = CODEX_API_KEY for api.openai.com        # `codex exec` takes an API key; the agent sees only a placeholder; or log in inside",
            "state = codex                                      # the login follows you across projects (not your real ~/.codex; settings stay per project)",
            "cmd = codex",
        ],
    ),
    (
        "gemini",
        "Gemini CLI (measured with 0.61.0: generativelanguage.googleapis.com with an API key, cloudcode-pa.googleapis.com and oauth2.googleapis.com with a Google login; play.googleapis.com for usage statistics)",
        &[
            "allow = generativelanguage.googleapis.com",
            "# allow = play.googleapis.com                      # usage statistics",
            "# secret = GEMINI_API_KEY for generativelanguage.googleapis.com # an API key the agent never holds (it sees a placeholder)",
            "# env = GEMINI_CLI_TRUST_WORKSPACE=true            # `gemini -p` runs only in a folder it trusts",
            "# allow = cloudcode-pa.googleapis.com             # with a Google login: its API (Code Assist)",
            "# allow = oauth2.googleapis.com                   # with a Google login: its refreshes and token checks",
            "# env = GOOGLE_GENAI_USE_GCA=true                 # log in with Google without a settings.json choice",
            "state = gemini                                     # the Google login follows you across projects, held by the gate (settings stay per project)",
            "cmd = gemini",
        ],
    ),
    (
        "opencode",
        "opencode (measured with 1.18.33: the model provider's API; models.opencode.ai for the model list; registry.npmjs.org for plugins)",
        &[
            "allow = api.anthropic.com                          # or your provider's API host",
            "env = OPENCODE_DISABLE_MODELS_FETCH=1              # no model list from models.opencode.ai",
            "# allow = registry.npmjs.org                       # plugins, fetched at start",
            "# secret = ANTHROPIC_API_KEY for api.anthropic.com # an API key the agent never holds (it sees a placeholder)",
            "state = ~/.local/share/opencode/auth.json          # the logins follow you across projects (settings stay per project)",
            "cmd = opencode",
        ],
    ),
    (
        "aider",
        "aider (measured: the model APIs; pypi.org and raw.githubusercontent.com for update checks and prices)",
        &[
            "allow = api.openai.com",
            "allow = api.anthropic.com",
            "env = AIDER_CHECK_UPDATE=false",
            "# secret = OPENAI_API_KEY for api.openai.com       # an API key the agent never holds (it sees a placeholder)",
            "# secret = ANTHROPIC_API_KEY for api.anthropic.com # the same for Anthropic's models",
            "# allow = pypi.org                                 # update checks",
            "# allow = raw.githubusercontent.com                # model prices",
            "cmd = aider",
        ],
    ),
    (
        "npm",
        "the npm registry",
        &[
            "allow = registry.npmjs.org",
            "allow = registry.yarnpkg.com",
            "env = NPM_CONFIG_UPDATE_NOTIFIER=false            # no update check on every npm run",
        ],
    ),
    ("pypi", "PyPI", &["allow = pypi.org", "allow = files.pythonhosted.org"]),
    ("cargo", "crates.io", &["allow = crates.io", "allow = index.crates.io", "allow = static.crates.io"]),
    (
        "github",
        "GitHub (git over HTTPS, fetch only; API, downloads)",
        &[
            "allow = github.com",
            "rule = github.com git-fetch                        # clone and fetch any repository; a push is refused",
            "# rule = github.com git-push /OWNER/REPO.git       # push to this one repository",
            "rule = github.com GET /*/*/releases/download/**    # release assets",
            "rule = github.com GET /*/*/archive/**              # source archives",
            "allow = api.github.com",
            "allow = codeload.github.com",
            "allow = objects.githubusercontent.com",
            "allow = raw.githubusercontent.com",
        ],
    ),
];

pub(crate) fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _, _)| *n).collect()
}

/// The config text for these presets (in the order given, duplicates merged).
pub(crate) fn render(presets: &[String]) -> Result<String, Hinted> {
    let mut out = String::from(
        "# .ai-sandbox/config — what this project's sandbox may reach. Commit it.\n\
         # Written by `ai-sandbox init`; `ai-sandbox help config` lists every key.\n\
         # Check what it allows with `ai-sandbox --dry-run`; refusals name the line that would allow them.\n",
    );
    let mut seen: Vec<&str> = Vec::new();
    let mut done: Vec<&str> = Vec::new();
    let mut cmd: Option<(&str, &str)> = None;
    // `--preset claude,npm` as well as `--preset claude --preset npm`.
    for name in presets.iter().flat_map(|p| p.split(',')).map(str::trim).filter(|p| !p.is_empty()) {
        let Some((n, what, lines)) = PRESETS.iter().find(|(n, _, _)| *n == name) else {
            let near = names().into_iter().find(|n| strsim::levenshtein(n, name) <= 2);
            return Err(hinted(
                match near {
                    Some(n) => format!("unknown preset `{name}`: did you mean `{n}`?"),
                    None => format!("unknown preset `{name}`"),
                },
                format!("presets are {}", names().join(", ")),
            ));
        };
        // Named twice (`--preset pypi --preset pypi`): written once.
        if done.contains(n) {
            continue;
        }
        done.push(n);
        out += &format!("\n# {n}: {what}\n");
        for l in lines.iter() {
            if let Some(c) = l.strip_prefix("cmd = ") {
                if let Some((other, prev)) = cmd {
                    return Err(hinted(
                        format!("presets `{other}` and `{n}` both set the command (`{prev}`, `{c}`)"),
                        "keep one agent preset",
                    ));
                }
                cmd = Some((n, c));
            }
            if seen.contains(l) {
                out += &format!("# {l}   (already above)\n");
            } else {
                seen.push(l);
                out += &format!("{l}\n");
            }
        }
    }
    if presets.is_empty() {
        out += "\n# Nothing is allowed yet: add `allow = HOST` lines, or re-run with --preset NAME\n";
        out += &format!("# (presets: {}).\n", names().join(", "));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_render_and_parse_as_a_valid_config() {
        let all: Vec<String> =
            ["claude", "npm", "pypi", "cargo", "github"].iter().map(|s| s.to_string()).collect();
        let text = render(&all).unwrap();
        insta::assert_snapshot!(text);
        let (cfg, errs) = crate::policy::keys::read(&text);
        assert!(errs.is_empty(), "{errs:?}");
        crate::policy::build("/p".into(), &cfg, &Default::default()).unwrap();
    }

    #[test]
    fn a_preset_named_twice_is_written_once() {
        let twice = |p: &str| render(&[p.to_string(), p.to_string()]).unwrap();
        assert_eq!(twice("pypi"), render(&["pypi".to_string()]).unwrap());
        assert_eq!(twice("claude").matches("cmd = claude").count(), 1, "not two commands");
    }

    #[test]
    fn every_preset_alone_is_valid() {
        for n in names() {
            let text = render(&[n.to_string()]).unwrap();
            let (cfg, errs) = crate::policy::keys::read(&text);
            assert!(errs.is_empty(), "{n}: {errs:?}");
            crate::policy::build("/p".into(), &cfg, &Default::default())
                .unwrap_or_else(|e| panic!("{n}: {e:?}"));
        }
    }

    #[test]
    fn two_agents_and_unknown_presets_are_refused() {
        let err = render(&["claude".into(), "codex".into()]).unwrap_err().to_string();
        assert!(err.contains("both set the command"), "{err}");
        let err = render(&["nmp".into()]).unwrap_err().to_string();
        assert!(err.contains("unknown preset `nmp`: did you mean `npm`?"), "{err}");
        let err = render(&["clade".into()]).unwrap_err().to_string();
        assert!(err.contains("did you mean `claude`?"), "{err}");
        let err = render(&["kubernetes".into()]).unwrap_err().to_string();
        assert!(err.contains("unknown preset `kubernetes`") && !err.contains("did you mean"), "{err}");
    }

    #[test]
    fn presets_given_with_commas_are_the_same_as_repeated() {
        let both = render(&["claude".into(), "npm".into()]).unwrap();
        assert_eq!(render(&["claude,npm".into()]).unwrap(), both);
        assert_eq!(render(&["claude, npm,".into()]).unwrap(), both);
    }

    #[test]
    fn shared_hosts_are_written_once() {
        let text = render(&["claude".into(), "npm".into(), "npm".into()]).unwrap();
        assert_eq!(text.matches("\nallow = registry.npmjs.org\n").count(), 1, "{text}");
    }

    #[test]
    fn no_preset_says_what_to_do() {
        insta::assert_snapshot!(render(&[]).unwrap());
    }
}
