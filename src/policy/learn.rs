//! What a learning run proposes (pure): the hostnames the gate relayed only because the run was
//! learning, as config lines, grouped by registrable domain (`registry.npmjs.org` and
//! `www.npmjs.org` under `npmjs.org`, from the Public Suffix List through the `psl` crate, so
//! `a.github.io` and `b.github.io` are two owners, two groups).
//!
//! Each group proposes its exact names, one `allow =` line each. A group of two or more also
//! offers the wildcard that covers them, `*.DOMAIN`, when the validator accepts it (never a
//! wildcard under a public suffix); the wildcard covers names strictly below DOMAIN, so DOMAIN
//! itself, when reached, stays a line of its own. Nothing here writes: the user accepts line by
//! line (`cli::learn`).

use super::allow::{self, Allow, HostPattern};

/// The lines proposed for one registrable domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The registrable domain (the name itself when the list knows none).
    pub domain: String,
    /// The exact names reached, sorted, each an `allow =` value.
    pub names: Vec<String>,
    /// `*.DOMAIN` when it covers two or more of `names` and the validator takes it.
    pub wildcard: Option<String>,
}

impl Group {
    /// The names the wildcard does not cover (DOMAIN itself), or every name without one.
    pub fn uncovered(&self) -> Vec<&str> {
        let covered = |n: &str| self.wildcard.is_some() && n != self.domain;
        self.names.iter().map(String::as_str).filter(|n| !covered(n)).collect()
    }
}

/// The groups for `learned` (hostnames as the gate logged them; repeats and any spelling that is
/// not an exact hostname, which the gate never learns, are dropped), by domain.
pub fn propose<'a>(learned: impl IntoIterator<Item = &'a str>) -> Vec<Group> {
    let mut names: Vec<String> = learned
        .into_iter()
        .filter(|h| matches!(allow::parse(h), Ok(Allow::Host(HostPattern::Exact(_), None))))
        .map(str::to_ascii_lowercase)
        .collect();
    names.sort();
    names.dedup();
    let mut groups: Vec<Group> = Vec::new();
    for n in names {
        let domain = psl::domain_str(&n).unwrap_or(&n).to_string();
        match groups.iter_mut().find(|g| g.domain == domain) {
            Some(g) => g.names.push(n),
            None => groups.push(Group { domain, names: vec![n], wildcard: None }),
        }
    }
    for g in &mut groups {
        let below = g.names.iter().filter(|n| **n != g.domain).count();
        let wild = format!("*.{}", g.domain);
        if below >= 2 && allow::parse(&wild).is_ok() {
            g.wildcard = Some(wild);
        }
    }
    groups.sort_by(|a, b| a.domain.cmp(&b.domain));
    groups
}

/// The proposal as the user reads it: a group per domain, its lines, and the wildcard offered.
pub fn render(groups: &[Group]) -> String {
    let mut out = String::new();
    for g in groups {
        out += &format!("  {}:\n", g.domain);
        for n in &g.names {
            out += &format!("    allow = {n}\n");
        }
        if let Some(w) = &g.wildcard {
            out += &format!("    (or, for every name below {}: allow = {w})\n", g.domain);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_grouped_by_registrable_domain_and_a_wildcard_is_offered_for_two_or_more() {
        let g = propose([
            "registry.npmjs.org",
            "www.npmjs.org",
            "registry.npmjs.org",
            "pypi.org",
            "files.pythonhosted.org",
            "npmjs.org",
        ]);
        let domains: Vec<&str> = g.iter().map(|g| g.domain.as_str()).collect();
        assert_eq!(domains, ["npmjs.org", "pypi.org", "pythonhosted.org"]);
        assert_eq!(g[0].names, ["npmjs.org", "registry.npmjs.org", "www.npmjs.org"]);
        assert_eq!(g[0].wildcard.as_deref(), Some("*.npmjs.org"));
        // The wildcard covers names strictly below: the domain itself stays a line.
        assert_eq!(g[0].uncovered(), ["npmjs.org"]);
        assert_eq!(g[1].wildcard, None, "one name: no wildcard");
        assert_eq!(g[1].uncovered(), ["pypi.org"]);
        assert_eq!(g[2].names, ["files.pythonhosted.org"]);
    }

    #[test]
    fn no_wildcard_under_a_public_suffix_and_owners_under_one_stay_apart() {
        // github.io is on the list's private section: each user's site is its own domain.
        let g = propose(["a.github.io", "b.github.io", "x.a.github.io"]);
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!(g[0].domain, "a.github.io");
        assert_eq!(g[0].names, ["a.github.io", "x.a.github.io"]);
        assert_eq!(g[0].wildcard, None, "only one name below a.github.io");
        // Two names below one domain of a name the list does not know (`.test`).
        let t = propose(["a.learn.test", "b.learn.test"]);
        assert_eq!(t[0].domain, "learn.test");
        assert_eq!(t[0].wildcard.as_deref(), Some("*.learn.test"));
        assert!(t[0].uncovered().is_empty());
    }

    #[test]
    fn what_is_not_an_exact_hostname_is_never_proposed() {
        let g = propose(["198.51.100.7", "[fd00::1]", "*.evil.test", "ok.test", "bad host"]);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].names, ["ok.test"]);
        let text = render(&g);
        assert_eq!(text, "  ok.test:\n    allow = ok.test\n");
    }
}
