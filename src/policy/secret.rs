//! A `secret` line's value: a name, and where its value comes from. Apart from `env` so the key
//! registry (`keys`) can read a value the way the policy does without depending on the policy.

/// Where a secret's value comes from, read only when a sandbox launches (never by a dry run,
/// never into the Policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretSource {
    /// The launching environment (`-e NAME`, `secret = NAME`).
    Env,
    /// A file (`secret = NAME from FILE`), absolute or `~/`, owned by the user, mode 0600 or less.
    File(String),
}

pub(crate) fn parse_secret(v: &str) -> Result<(String, SecretSource), (String, &'static str)> {
    let hint = "write `secret = NAME` (from your environment) or `secret = NAME from /path/to/file`";
    match v.split_once(" from ") {
        None => Ok((v.trim().to_string(), SecretSource::Env)),
        Some((name, file)) => {
            let file = file.trim();
            if file.starts_with('/') || file.starts_with("~/") {
                Ok((name.trim().to_string(), SecretSource::File(file.to_string())))
            } else {
                Err((format!("secret file `{file}` is not an absolute path (or `~/...`)"), hint))
            }
        }
    }
}
