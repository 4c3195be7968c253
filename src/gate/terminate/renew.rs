//! A held login's refresh, made by the gate (ADR 0087, ADR 0089): the CLI's POST to its token
//! endpoint (a JSON body, or Google's form), after every request phase let it through, goes
//! upstream with the real refresh token in place of the placeholder; the answer's new tokens go
//! to the store and to every session of the login (`login::take_answer`), and the CLI reads its
//! placeholders in their place. Both bodies are read whole (a token request and its answer are
//! small: at most `MAX`), so nothing of either passes before it is rewritten; the answer is
//! asked for and read uncompressed, and the real values are masked in whatever else it holds.

use super::super::login;
use super::super::pipeline::Asked;
use super::super::proto;
use super::super::response::mask_headers;
use super::super::scrub::{Coding, Scrubber};
use super::super::secrets::holds_placeholder;
use super::super::state::Entry;
use super::admit::Admitted;
use super::{Conn, full};
use http_body_util::{BodyExt, Limited};
use hyper::Request;
use hyper::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING,
};

/// A token request or answer larger than this is not one.
const MAX: usize = 64 << 10;

type Out = super::super::upstream::Out;

pub(super) async fn renew(c: &Conn, asked: &Asked<'_>, a: Admitted) -> hyper::Response<Out> {
    let fail = |status: u16, why: String| c.refuse(asked, status, &why, &format!("ai-sandbox gate: {why}"));
    let Admitted { mut parts, body, ahead, target, .. } = a;
    let mut sent: Vec<u8> = ahead.frames.iter().filter_map(|f| f.data_ref()).flatten().copied().collect();
    if !ahead.ended {
        match Limited::new(body, MAX.saturating_sub(sent.len())).collect().await {
            Ok(rest) => sent.extend_from_slice(&rest.to_bytes()),
            Err(_) => {
                return fail(
                    413,
                    format!("a request to the token endpoint of {} is over 64 KiB or broke off", c.host),
                );
            }
        }
    }
    let endpoint = format!("{}{}", c.host, asked.path.unwrap_or("/"));
    // One request of this login at a time, each refresh with the refresh token the last one
    // left; the grant is decided under the turn, with the store read again (a login another
    // session made, or `login import`, ends a first login's state before its exchange).
    let turn = login::turn(&endpoint).lock_owned().await;
    c.secrets.reload(&endpoint);
    let first = c.secrets.first_login(&endpoint);
    let pairs = match checked(c, &parts, &sent, &endpoint, first) {
        Ok(pairs) => pairs,
        Err(why) => return fail(403, why),
    };
    // The tokens as they are sent (under the turn): the answer is masked of these and of those
    // it brings, so an answer that echoes a token a refresh of another session replaced
    // meanwhile is masked too.
    let sent_masks = c.secrets.masks_with_logins(&c.host);
    let body = match &pairs {
        None => c.secrets.substitute_body(&sent, &c.host),
        Some(pairs) => c.secrets.substitute_form(pairs, &c.host),
    };
    let body = match body {
        Ok(b) => b,
        Err(why) => return fail(403, why),
    };
    let kind = if pairs.is_some() { "application/x-www-form-urlencoded" } else { "application/json" };
    parts.headers.remove(TRANSFER_ENCODING);
    parts.headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    parts.headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let mut sender = match c.sender().await {
        Ok(s) => s,
        Err(why) => return fail(502, why),
    };
    if let Err(why) = proto::for_upstream(&mut parts, sender.proto(), &c.host, c.port, &target) {
        return fail(400, why);
    }
    // Once the real refresh token is sent, the server may spend it: the exchange runs to its
    // end and the new tokens are stored even if the client goes away (its own task).
    let task = Exchange {
        secrets: c.secrets.clone(),
        state: c.state.clone(),
        session: c.session.id.clone(),
        host: c.host.clone(),
        port: c.port,
        path: asked.path.unwrap_or("/").to_string(),
        first,
        endpoint,
    };
    let req = Request::from_parts(parts, full(body));
    let done = tokio::spawn(async move {
        let _turn = turn;
        let sent = sender.send(req).await;
        (task.run(sent).await, sender)
    });
    let answered = match done.await {
        Ok((answered, sender)) => {
            c.put_back(sender).await;
            answered
        }
        Err(e) => return fail(502, format!("the refresh at {} ended: {e}", c.host)),
    };
    let (mut head, answer) = match answered {
        Ok(answered) => answered,
        Err(why) => return fail(502, why),
    };
    // Whatever else the answer holds of a real value, of any token of the login (the masks are
    // made after the refresh).
    let mut scrub = Scrubber::new(c.secrets.masks_with_logins(&c.host));
    head.headers.remove(TRANSFER_ENCODING);
    mask_headers(&mut scrub, &mut head.headers);
    let answer = scrub.whole(&answer).unwrap_or(answer);
    let mut sent_scrub = Scrubber::new(sent_masks);
    mask_headers(&mut sent_scrub, &mut head.headers);
    let answer = sent_scrub.whole(&answer).unwrap_or(answer);
    head.headers.insert(CONTENT_LENGTH, HeaderValue::from(answer.len()));
    head.extensions.remove::<hyper::ext::ReasonPhrase>();
    hyper::Response::from_parts(head, full(answer))
}

/// The request as checked (`login::check_refresh_head`, and the body by its login's kind): a
/// refresh, or a first login's code exchange when this session holds the login with no token
/// yet (ADR 0090). A form's pairs, decoded (`None`: a JSON body).
fn checked(
    c: &Conn,
    parts: &hyper::http::request::Parts,
    sent: &[u8],
    endpoint: &str,
    first: bool,
) -> Result<Option<Vec<(String, String)>>, String> {
    let placeholders = c.secrets.refresh_placeholders(endpoint);
    let grant = match first {
        true => login::Grant::Code,
        false => login::Grant::Refresh(&placeholders),
    };
    let form = c.secrets.form(endpoint, &grant);
    let checked =
        login::check_refresh_head(&parts.headers, parts.uri.query(), form).and_then(|()| match form {
            false => login::check_grant(sent, &grant, &holds_placeholder).map(|()| None),
            true => login::check_grant_form(sent, &grant, &holds_placeholder).map(Some),
        });
    checked.map_err(|why| {
        format!(
            "a request to the token endpoint of a login the gate holds is refused: {why} (a new login is made in a \
             sandbox whose login store has none, or on the host: `ai-sandbox login import AGENT`)"
        )
    })
}

/// What the refresh's own task needs of its connection.
struct Exchange {
    secrets: super::super::secrets::Secrets,
    state: std::sync::Arc<super::super::state::State>,
    session: String,
    host: String,
    port: u16,
    path: String,
    endpoint: String,
    /// A first login's code exchange (ADR 0090).
    first: bool,
}

impl Exchange {
    /// The answer read whole, and its tokens taken in: a 2xx answer must be a token answer
    /// (anything else at a token endpoint is not passed on: it could hold a token no mask
    /// knows).
    async fn run(
        self,
        resp: Result<hyper::Response<hyper::body::Incoming>, hyper::Error>,
    ) -> Result<(hyper::http::response::Parts, Vec<u8>), String> {
        let host = &self.host;
        let resp = resp.map_err(|e| format!("{host} did not answer: {e}"))?;
        let (head, incoming) = resp.into_parts();
        let coding = head.headers.get(CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("(not text)"));
        if !matches!(super::super::scrub::coding(coding), Ok(Coding::Identity)) {
            return Err(format!(
                "the token endpoint of {host} answered in a coding the gate does not read here"
            ));
        }
        let answer = match Limited::new(incoming, MAX).collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(_) => return Err(format!("the token endpoint of {host} answered over 64 KiB or broke off")),
        };
        if !head.status.is_success() {
            return Ok((head, answer));
        }
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let Some((rewritten, unstored)) =
            login::take_answer(&answer, self.secrets.renewed_at(&self.endpoint), now_ms, self.first)
        else {
            return Err(format!(
                "the token endpoint of {host} answered {} with no token the gate reads",
                head.status
            ));
        };
        let what =
            if self.first { "login made inside, taken by the gate" } else { "login refreshed by the gate" };
        let reason = match unstored {
            None => format!("{what}: the new tokens are in the store, placeholders in the answer"),
            Some(why) => {
                format!("{what}; the store was not written (this gate's sessions use the new tokens): {why}")
            }
        };
        let entry = Entry::allowed(&self.session, "POST", host, self.port, &reason);
        self.state.note(Entry { path: Some(&self.path), ..entry });
        Ok((head, rewritten))
    }
}
