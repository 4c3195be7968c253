//! The agents whose login a `state` line carries, and which fields of their files are the
//! login (see `state`): data only, so the key registry and the approval prompt read it without
//! importing the config reader.

/// Claude Code: the OAuth tokens, and of `.claude.json` (which also holds per-project MCP
/// servers, allowed tools and history) the account and the onboarding flags, so a new project
/// does not ask to log in again.
const CLAUDE: &[(&str, &[&str])] = &[
    (".credentials.json", &["claudeAiOauth"]),
    (
        ".claude.json",
        &["oauthAccount", "userID", "primaryApiKey", "hasCompletedOnboarding", "lastOnboardingVersion"],
    ),
];
/// Codex: `auth.json` (its `config.toml` holds MCP server and `notify` commands: not a login).
const CODEX: &[(&str, &[&str])] =
    &[("auth.json", &["OPENAI_API_KEY", "tokens", "last_refresh", "auth_mode"])];
/// Gemini CLI: `oauth_creds.json` is Google's token answer as it came; `google_accounts.json`
/// the account's address (so the CLI does not ask Google who it is at each start).
const GEMINI: &[(&str, &[&str])] = &[
    (
        "oauth_creds.json",
        &["access_token", "refresh_token", "scope", "token_type", "id_token", "expiry_date"],
    ),
    ("google_accounts.json", &["active", "old"]),
];

/// A token of a login that the gate holds (ADR 0087): the sandbox's copy of the login has a
/// placeholder of the same prefix and length in its place, which the gate swaps for the token
/// on `hosts` only.
pub(crate) struct HeldToken {
    /// The login file (as in the agent's list above) and the token's place in its JSON.
    pub(crate) file: &'static str,
    pub(crate) field: &'static [&'static str],
    /// What the real tokens start with; the placeholder starts with it too.
    pub(crate) prefix: &'static str,
    pub(crate) hosts: &'static [&'static str],
    /// Its name in the token endpoint's JSON answer (`None`: no endpoint renews it).
    pub(crate) answer: Option<&'static str>,
    /// The refresh token: it goes only into the body of a refresh, never into a header.
    pub(crate) refresh: bool,
    /// A JWT whose claims the CLI reads (its expiry, its account): the placeholder keeps the
    /// real header and claims and has the placeholder in place of the signature, which is what
    /// the gate holds (a JWT's claims are not a credential; its signature is).
    pub(crate) jwt: bool,
}

/// A login whose tokens the gate holds, and where it renews them.
pub(crate) struct HeldLogin {
    pub(crate) tokens: &'static [HeldToken],
    /// `HOST/PATH` of the token endpoint (a refresh is made there by the gate).
    pub(crate) endpoint: &'static str,
    /// Where the login file keeps the expiry, in milliseconds since the epoch.
    pub(crate) expiry: &'static [&'static str],
    /// The refresh's body is a form (`application/x-www-form-urlencoded`), not JSON.
    pub(crate) form: bool,
    /// A first login's code exchange is a form, not JSON.
    pub(crate) code_form: bool,
}

/// Claude Code's login (docs/agent-logins.md): the OAuth access token goes to the API host, the
/// refresh token to the token endpoint only; a Console login's key to the API host.
const CLAUDE_HELD: HeldLogin = HeldLogin {
    tokens: &[
        HeldToken {
            file: ".credentials.json",
            field: &["claudeAiOauth", "accessToken"],
            prefix: "sk-ant-oat01-",
            hosts: &["api.anthropic.com"],
            answer: Some("access_token"),
            refresh: false,
            jwt: false,
        },
        HeldToken {
            file: ".credentials.json",
            field: &["claudeAiOauth", "refreshToken"],
            prefix: "sk-ant-ort01-",
            hosts: &["platform.claude.com"],
            answer: Some("refresh_token"),
            refresh: true,
            jwt: false,
        },
        HeldToken {
            file: ".claude.json",
            field: &["primaryApiKey"],
            prefix: "sk-ant-api03-",
            hosts: &["api.anthropic.com"],
            answer: None,
            refresh: false,
            jwt: false,
        },
    ],
    endpoint: "platform.claude.com/v1/oauth/token",
    expiry: &["claudeAiOauth", "expiresAt"],
    form: false,
    code_form: false,
};

/// Codex's ChatGPT login (docs/agent-logins.md): the access token (a JWT whose expiry Codex
/// reads) goes to chatgpt.com, the refresh token to the token endpoint only; the id token (a JWT
/// whose claims Codex reads, and which OpenAI trades for an API key) goes nowhere; an API key
/// to api.openai.com.
const CODEX_HELD: HeldLogin = HeldLogin {
    tokens: &[
        HeldToken {
            file: "auth.json",
            field: &["tokens", "access_token"],
            prefix: "",
            hosts: &["chatgpt.com"],
            answer: Some("access_token"),
            refresh: false,
            jwt: true,
        },
        HeldToken {
            file: "auth.json",
            field: &["tokens", "refresh_token"],
            prefix: "",
            hosts: &["auth.openai.com"],
            answer: Some("refresh_token"),
            refresh: true,
            jwt: false,
        },
        HeldToken {
            file: "auth.json",
            field: &["tokens", "id_token"],
            prefix: "",
            hosts: &[],
            answer: Some("id_token"),
            refresh: false,
            jwt: true,
        },
        HeldToken {
            file: "auth.json",
            field: &["OPENAI_API_KEY"],
            prefix: "sk-",
            hosts: &["api.openai.com"],
            answer: None,
            refresh: false,
            jwt: false,
        },
    ],
    endpoint: "auth.openai.com/oauth/token",
    expiry: &[],
    form: false,
    code_form: true,
};

/// Gemini CLI's Google login (docs/agent-logins.md): the access token goes to the Code Assist
/// API and to the token endpoint's host (the CLI asks `tokeninfo` about it at each start, in a
/// header); the refresh token only into a refresh's form, at the token endpoint; the id token
/// (a JWT Google signs, which other services may take as proof of the account) goes nowhere.
const GEMINI_HELD: HeldLogin = HeldLogin {
    tokens: &[
        HeldToken {
            file: "oauth_creds.json",
            field: &["access_token"],
            prefix: "ya29.",
            hosts: &["cloudcode-pa.googleapis.com", "oauth2.googleapis.com"],
            answer: Some("access_token"),
            refresh: false,
            jwt: false,
        },
        HeldToken {
            file: "oauth_creds.json",
            field: &["refresh_token"],
            prefix: "",
            hosts: &["oauth2.googleapis.com"],
            answer: Some("refresh_token"),
            refresh: true,
            jwt: false,
        },
        HeldToken {
            file: "oauth_creds.json",
            field: &["id_token"],
            prefix: "",
            hosts: &[],
            answer: Some("id_token"),
            refresh: false,
            jwt: true,
        },
    ],
    endpoint: "oauth2.googleapis.com/token",
    expiry: &["expiry_date"],
    form: true,
    code_form: true,
};

/// The login of `agent` that the gate holds (`None`: the agent holds its login in clear).
pub(crate) fn held(agent: &str) -> Option<&'static HeldLogin> {
    match agent {
        "claude" => Some(&CLAUDE_HELD),
        "codex" => Some(&CODEX_HELD),
        "gemini" => Some(&GEMINI_HELD),
        _ => None,
    }
}

/// A known agent: (name, directory under HOME, variable that points the CLI at it, login files
/// with their fields).
pub(crate) type Known =
    (&'static str, &'static str, Option<&'static str>, &'static [(&'static str, &'static [&'static str])]);

/// Known agents (Gemini CLI's directory is under its `GEMINI_CLI_HOME`, the sandbox's HOME here,
/// so no variable points at it). Claude Code keeps `.claude.json` in CLAUDE_CONFIG_DIR when set, so one
/// directory holds it.
pub(crate) const KNOWN: &[Known] = &[
    ("claude", ".claude", Some("CLAUDE_CONFIG_DIR"), CLAUDE),
    ("codex", ".codex", Some("CODEX_HOME"), CODEX),
    ("gemini", ".gemini", None, GEMINI),
];

/// The files of an existing login in the real HOME, and where each goes in the agent's store
/// (both relative: to HOME, and to the store's login directory). Claude Code's `~/.claude.json`
/// lives inside its config directory when CLAUDE_CONFIG_DIR is set.
pub(crate) fn login_files(agent: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match agent {
        "claude" => {
            Some(&[(".claude/.credentials.json", ".credentials.json"), (".claude.json", ".claude.json")])
        }
        "codex" => Some(&[(".codex/auth.json", "auth.json")]),
        "gemini" => Some(&[
            (".gemini/oauth_creds.json", "oauth_creds.json"),
            (".gemini/google_accounts.json", "google_accounts.json"),
        ]),
        _ => None,
    }
}

/// The fields of `name` in `agent`'s login (None: the whole file, or not a known file).
pub(crate) fn fields_of(agent: &str, name: &str) -> Option<&'static [&'static str]> {
    let (_, _, _, files) = KNOWN.iter().find(|(n, ..)| *n == agent)?;
    files.iter().find(|(f, _)| *f == name).map(|(_, fields)| *fields)
}

/// What approving a `state` line shares, in words (the approval prompt says it).
pub(crate) fn shared_words(v: &str) -> String {
    let v = v.trim();
    match KNOWN.iter().find(|(n, ..)| *n == v) {
        Some((name, dir, _, files)) => {
            let files: Vec<String> =
                files.iter().map(|(f, fields)| format!("{dir}/{f} ({})", fields.join(", "))).collect();
            format!(
                "carries your {name} login into this sandbox and a login it refreshes back to your other projects: {} \
                 (its settings, hooks, memory and transcripts stay in this project)",
                files.join("; ")
            )
        }
        None => format!(
            "carries the file {v} into this sandbox and what the sandbox writes to it back to your other projects' sandboxes"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_fields_of_each_file() {
        assert_eq!(fields_of("codex", "auth.json").unwrap()[1], "tokens");
        assert_eq!(fields_of("codex", "config.toml"), None, "codex's config runs commands: not a login");
    }

    #[test]
    fn the_approval_names_every_shared_field() {
        let w = shared_words("claude");
        assert!(w.contains(".claude/.credentials.json (claudeAiOauth)") && w.contains("oauthAccount"), "{w}");
        assert!(shared_words("~/.config/gh/hosts.yml").contains("the file ~/.config/gh/hosts.yml"));
    }
}
