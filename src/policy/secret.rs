//! A `secret` line's value: a name, where its value comes from, and the hosts it is bound to.
//! Apart from `env` so the key registry (`keys`) can read a value the way the policy does
//! without depending on the policy.
//!
//! `secret = NAME [from FILE] [for HOST[, HOST...]]`. Bound (`for`), the sandbox holds only a
//! per-session placeholder, and the gate puts the real value into requests to those hosts
//! (see `gate::secrets`); unbound, the agent holds the value itself.

use super::allow::{Allow, HostPattern};
use serde::{Deserialize, Serialize};

/// Where a secret's value comes from, read only when a sandbox launches (never by a dry run,
/// never into the Policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretSource {
    /// The launching environment (`-e NAME`, `secret = NAME`).
    Env,
    /// A file (`secret = NAME from FILE`), absolute or `~/`, owned by the user, mode 0600 or less.
    File(String),
    /// One of the user's AWS credentials (`secret = aws[:PROFILE] for HOST`): from the
    /// environment (`AWS_ACCESS_KEY_ID`, ...), else the shared credentials file's profile
    /// (`PROFILE`, else `$AWS_PROFILE`, else `default`). The gate signs with them (ADR 0088).
    Aws { profile: Option<String>, part: AwsPart },
}

/// Which of a set of AWS credentials a bound secret is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwsPart {
    /// `AWS_ACCESS_KEY_ID`: in the signature's credential, to the bound hosts.
    KeyId,
    /// `AWS_SECRET_ACCESS_KEY`: signs, and goes nowhere.
    SecretKey,
    /// `AWS_SESSION_TOKEN`: a signed header or query parameter, to the bound hosts.
    SessionToken,
}

impl AwsPart {
    pub const ALL: [AwsPart; 3] = [AwsPart::KeyId, AwsPart::SecretKey, AwsPart::SessionToken];
    /// The variable the sandbox holds its placeholder in.
    pub fn var(self) -> &'static str {
        match self {
            AwsPart::KeyId => "AWS_ACCESS_KEY_ID",
            AwsPart::SecretKey => "AWS_SECRET_ACCESS_KEY",
            AwsPart::SessionToken => "AWS_SESSION_TOKEN",
        }
    }
}

/// One `secret` line, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretLine {
    pub(crate) name: String,
    pub(crate) from: SecretSource,
    /// Exact host names (lowercase) the value goes to; empty: the agent holds the value.
    pub(crate) hosts: Vec<String>,
}

pub(crate) fn parse_secret(v: &str) -> Result<SecretLine, (String, &'static str)> {
    let hint = "write `secret = NAME`, `secret = NAME from /path/to/file`, and `for HOST` after either to keep it out of the sandbox";
    let (rest, hosts) = match v.rsplit_once(" for ") {
        None => (v, Vec::new()),
        Some((rest, list)) => (rest, bound_hosts(list)?),
    };
    let aws = rest.trim();
    if aws == "aws" || aws.starts_with("aws:") {
        let profile = aws.strip_prefix("aws:").map(str::trim);
        if profile.is_some_and(|p| {
            p.is_empty() || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.@+".contains(&b))
        }) {
            return Err((format!("`{aws}`: the AWS profile is not a profile name"), AWS_HINT));
        }
        if hosts.is_empty() {
            return Err((
                "`secret = aws` needs `for HOST`: the gate signs requests to those hosts, and the sandbox holds placeholders".into(),
                AWS_HINT,
            ));
        }
        let from = SecretSource::Aws { profile: profile.map(String::from), part: AwsPart::KeyId };
        return Ok(SecretLine { name: "aws".into(), from, hosts });
    }
    let (name, from) = match rest.split_once(" from ") {
        None => (rest, SecretSource::Env),
        Some((name, file)) => {
            let file = file.trim();
            if !(file.starts_with('/') || file.starts_with("~/")) {
                return Err((format!("secret file `{file}` is not an absolute path (or `~/...`)"), hint));
            }
            (name, SecretSource::File(file.to_string()))
        }
    };
    Ok(SecretLine { name: name.trim().to_string(), from, hosts })
}

const AWS_HINT: &str = "write `secret = aws for bedrock-runtime.us-east-1.amazonaws.com` (your AWS credentials from the environment or ~/.aws/credentials), or `secret = aws:PROFILE for HOST`";

/// `HOST[, HOST...]` after `for`: exact names only (a wildcard would send the key to any name
/// under it, an attacker's included), no ports (it goes over HTTPS on the gate's TLS ports).
fn bound_hosts(list: &str) -> Result<Vec<String>, (String, &'static str)> {
    let hint = "bind a secret to exact host names: `secret = NAME for api.example.com, uploads.example.com`";
    let mut out: Vec<String> = Vec::new();
    for h in list.split([',', ' ', '\t']).filter(|h| !h.is_empty()) {
        match super::allow::parse(h) {
            Ok(Allow::Host(HostPattern::Exact(name), None)) => {
                if !out.contains(&name) {
                    out.push(name);
                }
            }
            Ok(Allow::Host(HostPattern::Suffix(_), _)) => {
                return Err((format!("`{h}`: a secret is bound to exact host names, not a wildcard"), hint));
            }
            Ok(Allow::Host(_, Some(_))) => {
                return Err((
                    format!("`{h}`: a bound secret goes over HTTPS (443, 8443), so give no port"),
                    hint,
                ));
            }
            Ok(Allow::Net(..)) => {
                return Err((
                    format!(
                        "`{h}`: a secret is bound to host names (the gate opens TLS to a name), not addresses"
                    ),
                    hint,
                ));
            }
            Err(e) => return Err((format!("`{h}`: {}", e.reason), hint)),
        }
    }
    if out.is_empty() {
        return Err(("`for` names no host".into(), hint));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_line_reads_name_source_and_hosts() {
        let l = parse_secret("K").unwrap();
        assert_eq!((l.name.as_str(), &l.from, l.hosts.len()), ("K", &SecretSource::Env, 0));
        let l = parse_secret("K for API.example.com, b.example.com a.example.com").unwrap();
        assert_eq!(l.hosts, ["api.example.com", "b.example.com", "a.example.com"]);
        let l = parse_secret("K from ~/keys/k for h.example.com").unwrap();
        assert_eq!(
            (l.from, l.hosts),
            (SecretSource::File("~/keys/k".into()), vec!["h.example.com".to_string()])
        );
        // A file path that itself holds " for " is read up to the last one.
        let l = parse_secret("K from /a for b/k for h.example.com").unwrap();
        assert_eq!(l.from, SecretSource::File("/a for b/k".into()));
    }

    #[test]
    fn a_binding_is_to_exact_names_only() {
        for (v, says) in [
            ("K for *.example.com", "wildcard"),
            ("K for h.example.com:443", "no port"),
            ("K for 10.0.0.1", "not addresses"),
            ("K for ", "names no host"),
            ("K for a!b.com", "`a!b.com`"),
            ("K from keys for h.example.com", "absolute"),
        ] {
            let (msg, _) = parse_secret(v).unwrap_err();
            assert!(msg.contains(says), "{v}: {msg}");
        }
    }
}
