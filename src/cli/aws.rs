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
pub(super) fn said(profile: Option<&str>) -> String {
    match profile {
        Some(p) => format!("profile {p} of ~/.aws/credentials"),
        None => "AWS_ACCESS_KEY_ID in your environment, else ~/.aws/credentials".into(),
    }
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
    let name =
        profile.map(String::from).or_else(|| nonempty("AWS_PROFILE")).unwrap_or_else(|| "default".into());
    let file = match nonempty("AWS_SHARED_CREDENTIALS_FILE") {
        Some(f) => match f.strip_prefix("~/") {
            Some(rest) => home.join(rest),
            None => PathBuf::from(f),
        },
        None => home.join(".aws/credentials"),
    };
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
    match profile_in(&text, &name) {
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

/// A profile's static keys in a credentials file's text: (key id, secret, session token).
fn profile_in(text: &str, name: &str) -> Option<(String, String, Option<String>)> {
    let (mut inside, mut key_id, mut secret, mut token) = (false, None, None, None);
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == name;
            continue;
        }
        let Some((k, v)) = line.split_once('=').filter(|_| inside) else { continue };
        let v = Some(v.trim().to_string()).filter(|v| !v.is_empty());
        match k.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => key_id = v,
            "aws_secret_access_key" => secret = v,
            "aws_session_token" => token = v,
            _ => {}
        }
    }
    Some((key_id?, secret?, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profiles_keys_are_read_and_only_that_profiles() {
        let text = "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key=dsecret\n\n# a comment\n\
                    [work]\nAWS_ACCESS_KEY_ID = AKIAWORK\naws_secret_access_key = w/secret+\naws_session_token = tok==\n\
                    [half]\naws_access_key_id = AKIAHALF\n";
        assert_eq!(profile_in(text, "default"), Some(("AKIADEFAULT".into(), "dsecret".into(), None)));
        assert_eq!(
            profile_in(text, "work"),
            Some(("AKIAWORK".into(), "w/secret+".into(), Some("tok==".into())))
        );
        assert_eq!(profile_in(text, "half"), None, "no secret: not a profile of static keys");
        assert_eq!(profile_in(text, "none"), None);
    }
}
