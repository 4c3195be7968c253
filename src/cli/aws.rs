//! The user's AWS credentials for `secret = aws for HOST` (ADR 0088), read at a launch only, as
//! AWS's own tools find static ones: the environment's `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` (with `AWS_SESSION_TOKEN`), else a profile of the shared credentials
//! file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`; the line's profile, else
//! `AWS_PROFILE`, else `default`). A profile named in the line is read from the file even when
//! the environment has keys: the line says which. SSO and `credential_process` profiles are
//! not run: the error says how to export their credentials instead.

use crate::error::hinted;
use crate::host::Host;
use std::path::{Path, PathBuf};

/// One set of credentials, and where they were read (for the launch's words).
pub(super) struct AwsCreds {
    pub(super) key_id: String,
    pub(super) secret: String,
    pub(super) token: Option<String>,
    pub(super) from: String,
}

impl AwsCreds {
    pub(super) fn part(&self, part: crate::policy::secret::AwsPart) -> Option<&str> {
        use crate::policy::secret::AwsPart;
        match part {
            AwsPart::KeyId => Some(&self.key_id),
            AwsPart::SecretKey => Some(&self.secret),
            AwsPart::SessionToken => self.token.as_deref(),
        }
    }
}

/// Where the dry run says the credentials would come from.
pub(super) fn said(host: &dyn Host, home: &Path, profile: Option<&str>) -> String {
    let (file, name) = profile_file(host, home, profile);
    match profile {
        Some(_) => format!("{} [{name}]", file.display()),
        None => format!("AWS_ACCESS_KEY_ID in your environment, else {} [{name}]", file.display()),
    }
}

/// The credentials file and the profile in it, as AWS's tools choose them.
fn profile_file(host: &dyn Host, home: &Path, profile: Option<&str>) -> (PathBuf, String) {
    let nonempty = |k: &str| host.env(k).filter(|v| !v.is_empty());
    let name =
        profile.map(String::from).or_else(|| nonempty("AWS_PROFILE")).unwrap_or_else(|| "default".into());
    let file = match nonempty("AWS_SHARED_CREDENTIALS_FILE") {
        Some(f) => match f.strip_prefix("~/") {
            Some(rest) => home.join(rest),
            None => PathBuf::from(f),
        },
        None => home.join(".aws/credentials"),
    };
    (file, name)
}

pub(super) fn read(host: &dyn Host, home: &Path, profile: Option<&str>) -> anyhow::Result<AwsCreds> {
    let nonempty = |k: &str| host.env(k).filter(|v| !v.is_empty());
    if profile.is_none()
        && let (Some(key_id), Some(secret)) =
            (nonempty("AWS_ACCESS_KEY_ID"), nonempty("AWS_SECRET_ACCESS_KEY"))
    {
        let token = nonempty("AWS_SESSION_TOKEN");
        return Ok(AwsCreds { key_id, secret, token, from: "your environment".into() });
    }
    let (file, name) = profile_file(host, home, profile);
    let hint = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) where you launch, or give the \
                profile keys in the credentials file (`aws configure`); for an SSO or credential_process profile, \
                export its credentials first: eval \"$(aws configure export-credentials --profile NAME --format env)\"";
    if host.read_file(&file)?.is_none() {
        return Err(hinted(
            format!(
                "secret = aws: no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and {} does not exist",
                file.display()
            ),
            hint,
        )
        .into());
    }
    let text = host.read_secret_file(&file)?;
    let found = profile_in(&text, &name).map_err(|why| {
        hinted(format!("secret = aws: {} {why}", file.display()), "keep one section per profile")
    })?;
    match found {
        Some((key_id, secret, token)) => {
            Ok(AwsCreds { key_id, secret, token, from: format!("{} [{name}]", file.display()) })
        }
        None => Err(hinted(
            format!(
                "secret = aws: {} has no profile [{name}] with aws_access_key_id and aws_secret_access_key",
                file.display()
            ),
            hint,
        )
        .into()),
    }
}

/// A profile's static keys in a credentials file's text: (key id, secret, session token);
/// `Err` when the file names the profile twice (AWS's tools refuse such a file too). Any line
/// that starts with `[` starts a section, whatever follows its `]` (`[dev] # keys`), so one
/// profile's keys never run into another's; `=` or `:` separates a key from its value.
fn profile_in(text: &str, name: &str) -> Result<Option<(String, String, Option<String>)>, String> {
    let (mut inside, mut seen, mut key_id, mut secret, mut token) = (false, false, None, None, None);
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let section = rest.split(']').next().unwrap_or("").trim();
            inside = section == name;
            if inside && std::mem::replace(&mut seen, true) {
                return Err(format!("names the profile [{name}] twice"));
            }
            continue;
        }
        let Some((k, v)) = line.split_once(['=', ':']).filter(|_| inside) else { continue };
        let v = Some(v.trim().to_string()).filter(|v| !v.is_empty());
        match k.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => key_id = v,
            "aws_secret_access_key" => secret = v,
            "aws_session_token" => token = v,
            _ => {}
        }
    }
    Ok(key_id.zip(secret).map(|(k, s)| (k, s, token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profiles_keys_are_read_and_only_that_profiles() {
        let text = "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key=dsecret\n\n# a comment\n\
                    [work]\nAWS_ACCESS_KEY_ID = AKIAWORK\naws_secret_access_key = w/secret+\naws_session_token = tok==\n\
                    [half]\naws_access_key_id = AKIAHALF\n";
        let some = |k: &str, s: &str, t: Option<&str>| Ok(Some((k.into(), s.into(), t.map(String::from))));
        assert_eq!(profile_in(text, "default"), some("AKIADEFAULT", "dsecret", None));
        assert_eq!(profile_in(text, "work"), some("AKIAWORK", "w/secret+", Some("tok==")));
        assert_eq!(profile_in(text, "half"), Ok(None), "no secret: not a profile of static keys");
        assert_eq!(profile_in(text, "none"), Ok(None));
        // A section line with a comment after it still ends the one before.
        let commented = "[prod]\naws_access_key_id = AKIAPROD\naws_secret_access_key = p\n[dev] # mine\n\
                         aws_access_key_id: AKIADEV\n";
        assert_eq!(
            profile_in(commented, "dev"),
            Ok(None),
            "dev has no secret of its own; prod's is not taken"
        );
        assert_eq!(profile_in(commented, "prod"), some("AKIAPROD", "p", None));
        let twice = "[dev]\naws_access_key_id = A\n[dev]\naws_secret_access_key = B\n";
        assert!(profile_in(twice, "dev").unwrap_err().contains("twice"));
    }
}
