//! A held login's refresh, made by the gate (ADR 0087): the CLI's POST to its token endpoint,
//! after every request phase let it through, goes upstream with the real refresh token in place
//! of the placeholder; the answer's new tokens go to the store and to every session of the
//! login (`login::take_answer`), and the CLI reads its placeholders in their place. Both bodies
//! are read whole (a token request and its answer are small: at most `MAX`), so nothing of
//! either passes before it is rewritten; the answer is asked for and read uncompressed, and
//! the real values are masked in whatever else it holds.

use super::super::login;
use super::super::pipeline::Asked;
use super::super::proto;
use super::super::response::mask_headers;
use super::super::scrub::{Coding, Scrubber};
use super::super::state::Entry;
use super::admit::Admitted;
use super::{Conn, full};
use http_body_util::{BodyExt, Limited};
use hyper::Request;
use hyper::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HeaderValue, TRANSFER_ENCODING};

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
    // One refresh of this login at a time, each with the refresh token the last one left.
    let turn = login::turn(&endpoint);
    let _turn = turn.lock().await;
    let body = match c.secrets.substitute_body(&sent, &c.host) {
        Ok(b) => b,
        Err(why) => return fail(403, why),
    };
    parts.headers.remove(TRANSFER_ENCODING);
    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    parts.headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let mut sender = match c.sender().await {
        Ok(s) => s,
        Err(why) => return fail(502, why),
    };
    if let Err(why) = proto::for_upstream(&mut parts, sender.proto(), &c.host, c.port, &target) {
        return fail(400, why);
    }
    let resp = sender.send(Request::from_parts(parts, full(body))).await;
    c.put_back(sender).await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => return fail(502, format!("{} did not answer: {e}", c.host)),
    };
    let (mut head, incoming) = resp.into_parts();
    let coding = head.headers.get(CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("(not text)"));
    if !matches!(super::super::scrub::coding(coding), Ok(Coding::Identity)) {
        return fail(
            502,
            format!("the token endpoint of {} answered in a coding the gate does not read here", c.host),
        );
    }
    let answer = match Limited::new(incoming, MAX).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => {
            return fail(502, format!("the token endpoint of {} answered over 64 KiB or broke off", c.host));
        }
    };
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let renewed = match head.status.is_success() {
        true => login::take_answer(&answer, c.secrets.renewed_at(&endpoint), now_ms),
        false => None,
    };
    let answer = match renewed {
        Some((rewritten, unstored)) => {
            let reason = match unstored {
                None => {
                    "login refreshed by the gate: the new tokens are in the store, placeholders in the answer"
                        .to_string()
                }
                Some(why) => format!(
                    "login refreshed by the gate; the store was not written (this gate's sessions use the new tokens): {why}"
                ),
            };
            c.state.note(Entry {
                path: asked.path,
                ..Entry::allowed(&c.session.id, asked.method, &c.host, c.port, &reason)
            });
            rewritten
        }
        None => answer,
    };
    // Whatever else the answer holds of a real value (the masks are made after the refresh).
    let mut scrub = Scrubber::new(c.secrets.masks(&c.host));
    head.headers.remove(TRANSFER_ENCODING);
    mask_headers(&mut scrub, &mut head.headers);
    let answer = scrub.whole(&answer).unwrap_or(answer);
    head.headers.insert(CONTENT_LENGTH, HeaderValue::from(answer.len()));
    head.extensions.remove::<hyper::ext::ReasonPhrase>();
    hyper::Response::from_parts(head, full(answer))
}
