//! Trusted policy (pure): a project's `.ai-sandbox/config` is applied only in a version the user
//! approved. The approved copy lives in the user's state directory, outside every project (the
//! sandbox cannot reach it), so an agent that edits the config, or a repository cloned with one,
//! changes nothing until the user has seen the change and said yes — the model of `direnv allow`
//! and `mise trust`.
//!
//! "The same config" means the same entries (key, value) in the same order: comments, blank
//! lines and spacing may change freely. This module decides and explains; `app` asks the user
//! and stores approvals through `Host`.

/// Where a config stands against the approved copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// No config file: nothing to approve (nothing is allowed either).
    NoConfig,
    /// The same entries as the approved copy.
    Approved,
    /// Never approved for this project directory.
    New,
    /// Approved once, changed since.
    Changed { approved: String },
}

impl Status {
    /// A config exists and is not (or no longer) the approved one.
    pub(crate) fn needs_approval(&self) -> bool {
        matches!(self, Status::New | Status::Changed { .. })
    }
}

pub(crate) fn status(current: Option<&str>, approved: Option<&str>) -> Status {
    match (current, approved) {
        (None, _) => Status::NoConfig,
        (Some(_), None) => Status::New,
        (Some(c), Some(a)) if same_entries(c, a) => Status::Approved,
        (Some(_), Some(a)) => Status::Changed { approved: a.to_string() },
    }
}

fn entries(text: &str) -> Vec<(String, String)> {
    crate::policy::keys::read(text).0.entries.into_iter().map(|e| (e.key, e.value)).collect()
}

fn same_entries(a: &str, b: &str) -> bool {
    entries(a) == entries(b)
}

/// A line that widens what the sandbox may do, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) line: usize,
    pub(crate) text: String,
    pub(crate) why: String,
}

/// The entries of `new` that widen the sandbox and were not in `old` (all of them when there is
/// no `old`), plus the narrowing lines (`protect`, `deny`) that `new` dropped.
pub(crate) fn findings(old: Option<&str>, new: &str) -> Vec<Finding> {
    let before: Vec<(String, String)> = old.map(entries).unwrap_or_default();
    let (cfg, _) = crate::policy::keys::read(new);
    let after: Vec<(String, String)> = cfg.entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect();
    let mut out: Vec<Finding> = cfg
        .entries
        .iter()
        .filter(|e| !before.iter().any(|(k, v)| *k == e.key && *v == e.value))
        .filter_map(|e| {
            let why = match e.key.as_str() {
                "rule" => rule_added(&e.value, &before),
                _ => super::keys::widening(&e.key, &e.value),
            };
            why.map(|why| Finding { line: e.line, text: format!("{} = {}", e.key, e.value), why })
        })
        .collect();
    for (k, v) in &before {
        let kept = after.iter().any(|(ak, av)| ak == k && av == v);
        let why = match k.as_str() {
            "rule" => rule_dropped(v, &after),
            _ => super::keys::widening_when_dropped(k).map(String::from),
        };
        if let Some(why) = why.filter(|_| !kept) {
            out.push(Finding { line: 0, text: format!("{k} = {v}"), why });
        }
    }
    out
}

/// The host a `rule` line is for.
fn rule_host(v: &str) -> Option<String> {
    super::rule::parse(v).ok()?.first().map(|r| r.host.to_string())
}

/// Whether `entries` hold a rule for `host`.
fn has_rules(entries: &[(String, String)], host: &str) -> bool {
    entries.iter().any(|(k, v)| k == "rule" && rule_host(v).as_deref() == Some(host))
}

/// A rule line added: the first rules for a host narrow it (it took every request before), so
/// they are not a widening; one more rule for a host that had rules lets it take more.
fn rule_added(v: &str, before: &[(String, String)]) -> Option<String> {
    let host = rule_host(v)?;
    has_rules(before, &host).then(|| super::keys::widening("rule", v)).flatten()
}

/// A rule line removed: the host's last rule gone, it takes every request again (a widening);
/// one of several gone, it takes less (not one).
fn rule_dropped(v: &str, after: &[(String, String)]) -> Option<String> {
    let host = rule_host(v)?;
    (!has_rules(after, &host)).then(|| format!("removed: {host} had rules, and now takes every request"))
}

/// A unified diff of the approved copy and the current text.
pub(crate) fn diff(approved: &str, current: &str, path: &str) -> String {
    similar::TextDiff::from_lines(approved, current)
        .unified_diff()
        .context_radius(2)
        .header(&format!("{path} (approved)"), &format!("{path} (now)"))
        .to_string()
}

/// What the user is shown: the config (first time) or the diff, then the widening lines.
pub(crate) fn explain(status: &Status, current: &str, path: &str) -> String {
    let mut out = match status {
        Status::New => {
            format!("{path} has not been approved for this project. It says:\n{}", indent(current))
        }
        Status::Changed { approved } => {
            format!("{path} changed since you approved it:\n{}", diff(approved, current, path))
        }
        Status::Approved | Status::NoConfig => return String::new(),
    };
    let old = match status {
        Status::Changed { approved } => Some(approved.as_str()),
        _ => None,
    };
    let f = findings(old, current);
    if !f.is_empty() {
        out += "\nLines that widen the sandbox:\n";
        for x in f {
            let at = if x.line > 0 { format!("line {}: ", x.line) } else { String::new() };
            out += &format!("  ! {at}{}\n      {}\n", x.text, x.why);
        }
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  | {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_spacing_do_not_need_approval_but_entries_do() {
        let a = "allow = github.com\n";
        assert_eq!(status(Some("# hi\nallow   =   github.com  # x\n"), Some(a)), Status::Approved);
        assert_eq!(status(None, Some(a)), Status::NoConfig);
        assert_eq!(status(Some(a), None), Status::New);
        let changed = status(Some("allow = github.com\nallow = evil.com\n"), Some(a));
        assert_eq!(changed, Status::Changed { approved: a.into() });
        // Order matters (the first `cmd` or `net` wins nothing, but keep it simple: any change).
        let two = "allow = a.com\nallow = b.com\n";
        assert!(matches!(status(Some("allow = b.com\nallow = a.com\n"), Some(two)), Status::Changed { .. }));
    }

    #[test]
    fn widening_lines_are_called_out_and_plain_values_are_not() {
        let new = "allow = github.com\nallow = *.example.com\nextra_args = -v /home/u:/realhome --device /dev/kvm\n\
                   net = full\nallow = 10.0.0.0/8:443\nallow = 100.64.0.1:1-65535\nimage = localhost/x\n\
                   env = LD_PRELOAD=/tmp/x.so\nenv = FOO=1\nallow = 198.51.100.7:443\n";
        let f = findings(None, new);
        let lines: Vec<usize> = f.iter().map(|x| x.line).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7, 8], "{f:#?}");
        assert_eq!(f[0].why, "lets the sandbox reach github.com through the gate, on the gate's ports");
        assert!(f[2].why.contains("mounts a host path (/home/u:/realhome)") && f[2].why.contains("/dev/kvm"));
        assert!(f[3].why.contains("egress policy off"));
        assert!(f[4].why.contains("wide network") && f[4].why.contains("private network"));
        assert!(f[5].why.contains("host's own loopback") && f[5].why.contains("65535 ports"));
        assert!(f[7].why.contains("LD_PRELOAD"));
    }

    #[test]
    fn the_first_rules_for_a_host_narrow_it_and_more_rules_or_dropping_the_last_widen_it() {
        let first = "allow = api.test\nrule = api.test GET /v1/*\n";
        let f = findings(Some("allow = api.test\n"), first);
        assert!(f.is_empty(), "the first rule narrows a host that took every request: {f:#?}");
        let more = "allow = api.test\nrule = api.test GET /v1/*\nrule = api.test POST /v1/upload\n";
        let f = findings(Some(first), more);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(
            f[0].text == "rule = api.test POST /v1/upload" && f[0].why.contains("POST /v1/upload"),
            "{f:#?}"
        );
        // One of two dropped: the host takes less. The last dropped: it takes everything.
        assert!(findings(Some(more), first).is_empty());
        let f = findings(Some(first), "allow = api.test\n");
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(f[0].why.contains("now takes every request"), "{f:#?}");
        // A first approval: rules only narrow what the allow lines let through.
        let f = findings(None, more);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].text, "allow = api.test");
    }

    #[test]
    fn only_what_changed_is_called_out_and_dropped_protection_is() {
        let old = "extra_args = -v /data:/data:ro\nprotect = scripts/deploy.sh\n";
        let new = "extra_args = -v /data:/data:ro\nextra_args = -v /:/host\n";
        let f = findings(Some(old), new);
        assert_eq!(f.len(), 2, "{f:#?}");
        // A deny line dropped widens too; one kept does not.
        let f2 = findings(Some("deny = 10.0.0.0/8\ndeny = a.example\n"), "deny = a.example\n");
        assert_eq!(f2.len(), 1, "{f2:#?}");
        assert!(f2[0].text == "deny = 10.0.0.0/8" && f2[0].why.contains("no longer refused"));
        assert_eq!(f[0].line, 2);
        assert!(f[1].text == "protect = scripts/deploy.sh" && f[1].why.contains("no longer protected"));
        let text = explain(&Status::Changed { approved: old.into() }, new, ".ai-sandbox/config");
        assert!(
            text.contains("+extra_args = -v /:/host") && text.contains("-protect = scripts/deploy.sh"),
            "{text}"
        );
        assert!(text.contains("! line 2: extra_args = -v /:/host"), "{text}");
    }

    #[test]
    fn secrets_special_addresses_ipv6_and_pins_are_called_out() {
        let new = "secret = DEPLOY_KEY from ~/.ssh/id_ed25519\nsecret = ANTHROPIC_API_KEY\n\
                   allow = 169.254.169.254:80\nallow = [2001:db8::1]:443\nallow = 64:ff9b::/96\n\
                   resolve = api.internal.example=10.1.2.3\nallow = fd00:ec2::254\nallow = 198.51.100.7:443\n";
        let f = findings(None, new);
        let lines: Vec<usize> = f.iter().map(|x| x.line).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7], "{f:#?}");
        assert!(
            f[0].why.contains("reads the file ~/.ssh/id_ed25519") && f[0].why.contains("DEPLOY_KEY"),
            "{}",
            f[0].why
        );
        assert!(f[1].why.contains("passes ANTHROPIC_API_KEY from your environment"), "{}", f[1].why);
        assert!(f[2].why.contains("the cloud metadata service"), "{}", f[2].why);
        assert!(f[3].why.contains("IPv6 entry"), "{}", f[3].why);
        assert!(f[4].why.contains("NAT64") && f[4].why.contains("IPv6 entry"), "{}", f[4].why);
        assert!(
            f[5].why.contains("pins api.internal.example to 10.1.2.3, which is a private network"),
            "{}",
            f[5].why
        );
        assert!(f[6].why.contains("the cloud metadata service"), "{}", f[6].why);
    }
}
