//! What the sandbox trusts when the gate terminates TLS (hosts of bound secrets, hosts with
//! rules): the gate's CA certificate (public; its key never leaves the gate's memory), added to
//! the host's roots in a bundle mounted where the system bundle is read, and the variables
//! common clients read. Nothing here when neither is configured: then every host is a blind
//! tunnel.

use super::session::Facts;
use crate::policy::{Image, Policy};
use std::path::PathBuf;

/// Inside: the gate's CA alone, and the bundle (the host's roots, then the gate's CA).
pub(crate) const GATE_CA: &str = "/run/ai-sandbox/gate-ca.pem";
pub(crate) const BUNDLE: &str = "/run/ai-sandbox/ca-bundle.pem";
/// The system bundle path of Debian, Ubuntu and their images (OpenSSL, curl, git, Python, Go
/// read it), replaced inside by the bundle.
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the other families' images keep it, each replaced by the bundle too in a named image:
/// Fedora, RHEL and CentOS (the link, and the file it names), Alpine and Arch (`cert.pem`, also
/// LibreSSL's and Go's first guess on some), openSUSE. A path the image lacks is made in the
/// container's own root (a named image's root is made fresh for each run).
pub(crate) const OTHER_BUNDLES: &[&str] = &[
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// Variables clients read for their roots: each set to the bundle, except Node's, which adds
/// one file to its own roots (the gate's CA).
pub(crate) const VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    "AWS_CA_BUNDLE",
    "CODEX_CA_CERTIFICATE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "NODE_EXTRA_CA_CERTS",
];

/// The files to write in the session dir (path, text), when the gate terminates TLS.
pub(crate) fn files(f: &Facts) -> Vec<(std::path::PathBuf, String)> {
    let Some(ca) = &f.gate_ca else { return Vec::new() };
    let roots = f.system_roots.as_deref().unwrap_or_default();
    let sep = if roots.is_empty() || roots.ends_with('\n') { "" } else { "\n" };
    vec![(f.gate_ca_file(), ca.clone()), (f.ca_bundle_file(), format!("{roots}{sep}{ca}"))]
}

/// The read-only mounts for them: (the file on the host, where it is inside).
pub(crate) fn mounts(p: &Policy, f: &Facts) -> Vec<(PathBuf, PathBuf)> {
    if f.gate_ca.is_none() {
        return Vec::new();
    }
    let bundle = f.ca_bundle_file();
    let mut out = vec![(f.gate_ca_file(), PathBuf::from(GATE_CA)), (bundle.clone(), PathBuf::from(BUNDLE))];
    // On `image = host` only over a file the host has (its /etc is mounted read-only, so a new
    // mount point cannot be made there); an image gets it at every family's path.
    if p.image != Image::Host || f.system_roots.is_some() {
        out.push((bundle.clone(), PathBuf::from(SYSTEM_BUNDLE)));
    }
    if p.image != Image::Host {
        out.extend(OTHER_BUNDLES.iter().map(|b| (bundle.clone(), PathBuf::from(b))));
    }
    out
}

/// The variables, except those the user set (said in `notices`).
pub(crate) fn env(p: &Policy, f: &Facts) -> Vec<(String, String)> {
    if f.gate_ca.is_none() {
        return Vec::new();
    }
    VARS.iter()
        .filter(|v| !p.user_sets(v))
        .map(|v| (v.to_string(), if *v == "NODE_EXTRA_CA_CERTS" { GATE_CA } else { BUNDLE }.to_string()))
        .collect()
}

/// What the launch says about secrets: which the agent holds in clear and which it sees only
/// as placeholders; and a CA variable the user set, which then does not name the gate's CA.
pub(crate) fn notices(p: &Policy, f: &Facts) -> Vec<String> {
    let mut n = Vec::new();
    // A held login's tokens are said by its `state` line's notice (`plan::notices`).
    // So are the AWS credentials the gate signs with (`secret = aws`).
    let said_elsewhere = |b: &&crate::gate::secrets::Bound| {
        b.aws.is_some() || f.held.iter().any(|h| h.placeholder.contains(&b.placeholder))
    };
    for b in f.bound.iter().filter(|b| !said_elsewhere(b)) {
        n.push(format!(
            "{}: the sandbox holds a placeholder; the gate puts the value into HTTPS requests to {} only",
            b.name,
            b.hosts.join(", ")
        ));
    }
    let clear: Vec<&str> = p
        .secrets
        .iter()
        .filter(|s| s.hosts.is_empty() && !f.missing_secrets.contains(&s.name))
        .map(|s| s.name.as_str())
        .collect();
    if !clear.is_empty() {
        n.push(format!(
            "the agent holds the value of {} in clear (`secret = NAME for HOST` keeps a key out of the sandbox)",
            clear.join(", ")
        ));
    }
    let mut ruled: Vec<String> = Vec::new();
    // With `--net none` nothing is reached, and nothing is said about how it would be.
    for r in p.rules.iter().filter(|_| p.net == crate::policy::NetMode::Allow) {
        let h = r.host.to_string();
        if !ruled.contains(&h) {
            ruled.push(h);
        }
    }
    if !ruled.is_empty() {
        n.push(format!(
            "{}: only the requests the rules allow go through (the gate opens their TLS to read each method and path)",
            ruled.join(", ")
        ));
    }
    if f.gate_ca.is_some() {
        for (k, _) in p.env.iter().filter(|(k, _)| VARS.contains(&k.as_str())) {
            n.push(format!(
                "{k} is set by you, so clients that read it do not trust the gate's CA ({GATE_CA}): \
                 their HTTPS to a bound secret's host or a host with rules fails"
            ));
        }
    }
    n
}
