//! MCP over streamable HTTP, for `rule = HOST mcp PATH TOOL...` (pure): what a request body asks
//! of the server, the refusal of a tool no rule allows (as JSON-RPC errors the client reads), and
//! the answers filtered so that a `tools/list` result shows only the allowed tools — in a JSON
//! body and in each event of a server-sent-event stream.
//!
//! What the gate cannot read is refused, never passed: a body that is not JSON-RPC 2.0 (or that
//! another parser could read otherwise: a key twice, case aside), a batch with anything but
//! messages in it, a `tools/call` without a tool's name, an answer or event that could list tools
//! and is not JSON. Every other method (`initialize`, notifications, `ping`, resources, prompts)
//! passes as it came. The terminated path reads the body (`terminate::admit`) and
//! filters the answer (`response::McpFiltered`).

use serde_json::Value;

/// The most of a request body on an MCP endpoint the gate reads to decide (larger: refused).
pub(crate) const BODY_MOST: usize = 1 << 20;
/// The most of one answer the gate holds to filter it: a JSON body, or one event of a stream.
pub(crate) const ANSWER_MOST: usize = 8 << 20;
/// The JSON-RPC error code of a refusal (the range JSON-RPC leaves to servers).
pub(crate) const REFUSED: i64 = -32001;
/// The longest tool name a call may give (MCP says 128 characters; a rule's pattern is at most
/// 128 bytes): a longer one is refused unread, never logged or counted.
const TOOL_NAME_MOST: usize = 128;

/// Whether a request's Content-Type is JSON as the gate reads it: `application/json`, with no
/// parameter but `charset=utf-8`. A server decodes the body by its charset (in UTF-7, `+AGU-`
/// is an `e` the gate would not see), so any other is refused.
pub(crate) fn json_type(v: &[u8]) -> bool {
    let Ok(t) = std::str::from_utf8(v) else { return false };
    let (media, mut parameters) = media_type(t);
    if media != "application/json" {
        return false;
    }
    parameters.all(|p| {
        let Some((k, v)) = p.split_once('=') else { return p.trim().is_empty() };
        let v = v.trim();
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
        k.trim().eq_ignore_ascii_case("charset")
            && (v.eq_ignore_ascii_case("utf-8") || v.eq_ignore_ascii_case("utf8"))
    })
}

/// A Content-Type's media type, lowercased, and its parameters as written.
pub(crate) fn media_type(t: &str) -> (String, std::str::Split<'_, char>) {
    let mut parts = t.split(';');
    (parts.next().unwrap_or("").trim().to_ascii_lowercase(), parts)
}

/// The messages of one request body.
#[derive(Debug, PartialEq)]
pub(crate) struct Calls {
    messages: Vec<Message>,
    batch: bool,
}

#[derive(Debug, PartialEq)]
struct Message {
    /// A request's id (`None`: a notification, or a response to the server).
    id: Option<Value>,
    /// The tool a `tools/call` names.
    tool: Option<String>,
}

/// Reads a POST body on an MCP endpoint.
pub(crate) fn read(body: &[u8]) -> Result<Calls, String> {
    let Strict(v) =
        serde_json::from_slice(body).map_err(|e| format!("it is not JSON as the gate reads it ({e})"))?;
    let (items, batch) = match v {
        Value::Array(items) if items.is_empty() => return Err("it is an empty batch".into()),
        Value::Array(items) => (items, true),
        one => (vec![one], false),
    };
    let messages = items.iter().map(message).collect::<Result<_, _>>()?;
    Ok(Calls { messages, batch })
}

/// The keys a server reads in a message, and in a call's `params`.
const MESSAGE_KEYS: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];
const PARAMS_KEYS: [&str; 2] = ["name", "arguments"];

/// A key as a parser that ignores case reads it (Go's `encoding/json` also folds `ſ` to `s` and
/// the Kelvin sign to `k`).
fn folded(k: &str) -> String {
    k.to_uppercase().to_lowercase()
}

/// A key that such a parser would read as one of `known` without being it: refused.
fn spelled_otherwise(m: &serde_json::Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match m.keys().find(|k| !known.contains(&k.as_str()) && known.contains(&folded(k).as_str())) {
        Some(k) => Err(format!("it has the key {k:?}, which some servers read as {:?}", folded(k))),
        None => Ok(()),
    }
}

fn message(v: &Value) -> Result<Message, String> {
    let Value::Object(m) = v else { return Err("it holds something that is not a JSON-RPC message".into()) };
    spelled_otherwise(m, &MESSAGE_KEYS)?;
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err("it is not JSON-RPC 2.0".into());
    }
    if m.contains_key("method") && (m.contains_key("result") || m.contains_key("error")) {
        return Err("it holds a message that is both a request and a response".into());
    }
    if let Some(Value::Object(params)) = m.get("params") {
        spelled_otherwise(params, &PARAMS_KEYS)?;
    }
    let id = m.get("id").filter(|id| !id.is_null()).cloned();
    match m.get("method") {
        Some(Value::String(method)) if method == "tools/call" => {
            let name = m.get("params").and_then(|p| p.get("name")).and_then(Value::as_str);
            let tool = name.ok_or("its tools/call names no tool")?.to_string();
            if tool.len() > TOOL_NAME_MOST {
                return Err(format!("its tools/call names a tool longer than {TOOL_NAME_MOST} bytes"));
            }
            Ok(Message { id, tool: Some(tool) })
        }
        Some(Value::String(_)) => Ok(Message { id, tool: None }),
        Some(_) => Err("its method is not text".into()),
        // The client's answer to a server's request (sampling, elicitation).
        None if m.contains_key("result") || m.contains_key("error") => Ok(Message { id, tool: None }),
        None => Err("it holds a message that is neither a request nor a response".into()),
    }
}

/// `body` as JSON whose objects each name a key once, in any case (`Strict`).
pub(crate) fn strict_json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice::<Strict>(body).map(|Strict(v)| v).map_err(|e| e.to_string())
}

/// A JSON value whose objects each name a key once, in any case. Parsers differ on a key given
/// twice (most keep the last, some the first; some ignore case), so the gate could check one call
/// and the server run another, or filter one tool list and the client read another: such a body
/// or answer is refused.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(folded(&k)) {
                return Err(serde::de::Error::custom(format!(
                    "the key {k:?} twice in one object (case aside)"
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// Whether one of `patterns` allows `tool`.
pub(crate) fn allowed(patterns: &[String], tool: &str) -> bool {
    patterns.iter().any(|p| crate::policy::rule::tool_matches(p, tool))
}

impl Calls {
    /// The first tool the body calls that no pattern allows.
    pub(crate) fn refused(&self, patterns: &[String]) -> Option<&str> {
        self.messages.iter().filter_map(|m| m.tool.as_deref()).find(|t| !allowed(patterns, t))
    }

    /// The first tool the body calls that no pattern allows, other than `tool` (a watcher let
    /// that one through once; a name is compared whole, never as a pattern).
    pub(crate) fn refused_besides(&self, patterns: &[String], tool: &str) -> Option<&str> {
        self.messages.iter().filter_map(|m| m.tool.as_deref()).find(|t| *t != tool && !allowed(patterns, t))
    }

    /// The names of the tools the body calls (for the log).
    pub(crate) fn tools(&self) -> Vec<&str> {
        self.messages.iter().filter_map(|m| m.tool.as_deref()).collect()
    }

    /// The answer to a body with a refused call: a JSON-RPC error for each request in it (none is
    /// sent), the refused tool's carrying `hint`. `None` when nothing in it awaits an answer.
    pub(crate) fn refusal(&self, refused: &str, hint: &str) -> Option<Vec<u8>> {
        let errors: Vec<Value> = self
            .messages
            .iter()
            .filter_map(|m| {
                let id = m.id.clone()?;
                let message = match m.tool.as_deref() {
                    Some(t) if t == refused => hint.to_string(),
                    _ => format!("not sent: the call of {refused} in the same batch was refused"),
                };
                let error = serde_json::json!({ "code": REFUSED, "message": message });
                Some(serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": error }))
            })
            .collect();
        let body = match (self.batch, errors.as_slice()) {
            (_, []) => return None,
            (false, [one]) => one.clone(),
            _ => Value::Array(errors),
        };
        Some(body.to_string().into_bytes())
    }
}

/// Removes the tools no pattern allows from each `tools/list` result in `v` (a message or a
/// batch); how many it removed. A listed tool without a name is removed too.
pub(crate) fn filter(v: &mut Value, patterns: &[String]) -> usize {
    match v {
        Value::Array(items) => items.iter_mut().map(|m| filter(m, patterns)).sum(),
        Value::Object(m) => match m.get_mut("result").and_then(|r| r.get_mut("tools")) {
            Some(Value::Array(tools)) => {
                let before = tools.len();
                tools.retain(|t| t.get("name").and_then(Value::as_str).is_some_and(|n| allowed(patterns, n)));
                before - tools.len()
            }
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether an answer could hold a `tools` key as a client reads it: the word, an escape that
/// could spell it, or a NUL (JSON in UTF-16 or UTF-32, which some clients decode). Without any
/// there is nothing to filter, and the answer is not parsed (most are a tool's result); one that
/// is not JSON then passes too, as an answer that lists nothing.
fn may_list(text: &[u8]) -> bool {
    let has = |w: &[u8]| text.windows(w.len()).any(|x| x == w);
    has(b"tools") || has(b"\\u") || text.contains(&0)
}

/// A JSON answer, filtered: the bytes to send (as they came when nothing was removed) and how
/// many tools were removed.
pub(crate) fn filter_json(body: &[u8], patterns: &[String]) -> Result<(Vec<u8>, usize), String> {
    if body.iter().all(u8::is_ascii_whitespace) || !may_list(body) {
        return Ok((body.to_vec(), 0));
    }
    let Strict(mut v) = serde_json::from_slice(body)
        .map_err(|e| format!("an answer that is not JSON as the gate reads it ({e})"))?;
    match filter(&mut v, patterns) {
        0 => Ok((body.to_vec(), 0)),
        n => Ok((v.to_string().into_bytes(), n)),
    }
}

/// A server-sent-event stream, filtered event by event as it comes. Lines end as the event
/// stream format says (CR LF, LF or CR), an empty line ends an event, and a byte-order mark at
/// the stream's start is not part of its first line: read as a client reads them.
#[derive(Default)]
pub(crate) struct Events {
    held: Vec<u8>,
    /// Where the line being read starts in `held`.
    line: usize,
    /// How far `held` was searched for that line's end (each byte is searched once).
    searched: usize,
    /// Whether the stream's first bytes were seen (for a byte-order mark).
    started: bool,
    /// Tools removed so far.
    pub(crate) hidden: usize,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl Events {
    /// The events complete after `bytes`, filtered; what is left of an event is held.
    pub(crate) fn push(&mut self, bytes: &[u8], patterns: &[String]) -> Result<Vec<u8>, String> {
        self.held.extend_from_slice(bytes);
        let mut out = Vec::new();
        if !self.started {
            if self.held.len() < BOM.len() && BOM.starts_with(&self.held) {
                return Ok(out);
            }
            self.started = true;
            if self.held.starts_with(BOM) {
                out.extend(self.held.drain(..BOM.len()));
            }
        }
        out.extend(self.events(false, patterns)?);
        if self.held.len() > ANSWER_MOST {
            return Err(format!("an event longer than {} MiB", ANSWER_MOST >> 20));
        }
        Ok(out)
    }

    /// How many bytes of an event are held, waiting for its end.
    pub(crate) fn holding(&self) -> usize {
        self.held.len()
    }

    /// The stream ended: what was held, its last line ended and its last event too.
    pub(crate) fn end(&mut self, patterns: &[String]) -> Result<Vec<u8>, String> {
        self.started = true;
        let mut out = self.events(true, patterns)?;
        let rest = std::mem::take(&mut self.held);
        if !rest.is_empty() {
            out.extend(self.event(&rest, b"", patterns)?);
        }
        Ok(out)
    }

    /// The events `held` completes, filtered and taken out of it (at once, after the last: a
    /// piece of many short events is not moved once per event).
    fn events(&mut self, at_end: bool, patterns: &[String]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        // Where the event being read starts in `held`.
        let mut start = 0;
        loop {
            match line_end(&self.held, self.searched.max(self.line), at_end) {
                Err(resume) => {
                    self.held.drain(..start);
                    (self.line, self.searched) = (self.line - start, resume - start);
                    return Ok(out);
                }
                // An empty line: the event before it ends.
                Ok((end, next)) if end == self.line => {
                    let event = self.held[start..next].to_vec();
                    out.extend(self.event(&event[..end - start], &event[end - start..], patterns)?);
                    start = next;
                    (self.line, self.searched) = (next, next);
                }
                Ok((_, next)) => (self.line, self.searched) = (next, next),
            }
        }
    }

    /// One event (its lines, then the blank line that ended it): unchanged unless its data is a
    /// message with tools to remove; then its other fields as they were and the data on one line.
    fn event(&mut self, lines: &[u8], sep: &[u8], patterns: &[String]) -> Result<Vec<u8>, String> {
        let text = std::str::from_utf8(lines).map_err(|_| "an event that is not UTF-8".to_string())?;
        let mut data: Vec<&str> = Vec::new();
        let mut other: Vec<&str> = Vec::new();
        for line in text.split("\r\n").flat_map(|l| l.split(['\n', '\r'])) {
            match line.strip_prefix("data") {
                Some(rest) if rest.is_empty() || rest.starts_with(':') => {
                    let value = rest.strip_prefix(':').unwrap_or(rest);
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                }
                _ => other.push(line),
            }
        }
        let joined = data.join("\n");
        if joined.trim().is_empty() || !may_list(joined.as_bytes()) {
            return Ok([lines, sep].concat());
        }
        let Strict(mut v) = serde_json::from_str(&joined)
            .map_err(|e| format!("an event whose data is not JSON as the gate reads it ({e})"))?;
        let n = filter(&mut v, patterns);
        if n == 0 {
            return Ok([lines, sep].concat());
        }
        self.hidden += n;
        let mut out = String::new();
        for line in other.iter().filter(|l| !l.is_empty()) {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
        Ok(out.into_bytes())
    }
}

/// The end of the line that `b[from..]` is in, and where the next line starts; `Err`: not known
/// yet, with where to search again (a CR last may be the first half of a CR LF).
fn line_end(b: &[u8], from: usize, at_end: bool) -> Result<(usize, usize), usize> {
    let Some(i) = b[from..].iter().position(|&c| c == b'\n' || c == b'\r').map(|i| from + i) else {
        return Err(b.len());
    };
    match (b[i], b.get(i + 1)) {
        (b'\n', _) => Ok((i, i + 1)),
        (_, Some(b'\n')) => Ok((i, i + 2)),
        (_, Some(_)) => Ok((i, i + 1)),
        (_, None) if at_end => Ok((i, i + 1)),
        (_, None) => Err(i),
    }
}

/// A tools/list result's tools, by name (for tests and the log).
#[cfg(test)]
fn names(v: &Value) -> Vec<String> {
    let tools = v.get("result").and_then(|r| r.get("tools")).and_then(Value::as_array);
    tools.into_iter().flatten().filter_map(|t| t.get("name")?.as_str().map(str::to_string)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pats(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    fn call(id: u64, tool: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        )
    }

    #[test]
    fn json_is_utf8_json_with_no_other_parameter_and_names_are_bounded() {
        for ok in [
            "application/json",
            "APPLICATION/JSON ; Charset=\"utf-8\"",
            "application/json;charset=UTF8",
            "application/json;",
        ] {
            assert!(json_type(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "application/json; charset=utf-7",
            "application/json; charset=shift_jis",
            "application/json; charset=utf-8; q=1",
            "application/json; boundary",
            "application/json-rpc",
            "text/json",
            "",
        ] {
            assert!(!json_type(bad.as_bytes()), "{bad}");
        }
        assert!(!json_type(b"application/json\xff"));
        let name = "n".repeat(TOOL_NAME_MOST);
        assert!(read(call(1, &name).as_bytes()).is_ok());
        let e = read(call(1, &format!("{name}n")).as_bytes()).unwrap_err();
        assert!(e.contains("longer than 128 bytes"), "{e}");
    }

    #[test]
    fn an_answer_with_a_key_twice_is_refused_as_a_client_could_read_either() {
        let p = pats(&["ok"]);
        let twice =
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"hidden"}],"tools":[{"name":"ok"}]}}"#;
        assert!(filter_json(twice.as_bytes(), &p).unwrap_err().contains("twice"));
        let mut e = Events::default();
        let event = format!("data: {twice}\n\n");
        assert!(e.push(event.as_bytes(), &p).unwrap_err().contains("twice"));
        // Control: once, filtered.
        let once = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"hidden"},{"name":"ok"}]}}"#;
        assert_eq!(filter_json(once.as_bytes(), &p).unwrap().1, 1);
    }

    #[test]
    fn the_strict_reader_reads_every_json_type_as_serde_json_does() {
        let doc = r#"{"t":true,"f":false,"neg":-3,"pos":7,"big":18446744073709551615,"x":1.5,
            "n":null,"s":"\u00e9","a":[1,"x",[],{}],"o":{"k":{"z":null}}}"#;
        let Strict(v) = serde_json::from_str(doc).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(doc).unwrap());
    }

    #[test]
    fn a_call_of_a_tool_no_pattern_allows_is_found_in_a_message_and_in_a_batch() {
        let p = pats(&["search_*", "create_issue"]);
        let one = read(call(1, "search_issues").as_bytes()).unwrap();
        assert_eq!((one.refused(&p), one.tools()), (None, vec!["search_issues"]));
        let bad = read(call(2, "delete_repository").as_bytes()).unwrap();
        assert_eq!(bad.refused(&p), Some("delete_repository"));
        let batch = format!(
            r#"[{},{},{{"jsonrpc":"2.0","method":"notifications/initialized"}}]"#,
            call(3, "create_issue"),
            call(4, "delete_repository")
        );
        let b = read(batch.as_bytes()).unwrap();
        assert_eq!(b.refused(&p), Some("delete_repository"));
        assert_eq!(b.refused(&pats(&["*"])), None);
        // Once for one refused tool is not once for another in the same batch.
        let two = format!("[{},{}]", call(5, "delete_repository"), call(6, "*"));
        let two = read(two.as_bytes()).unwrap();
        assert_eq!(two.refused_besides(&p, "delete_repository"), Some("*"));
        assert_eq!(two.refused_besides(&p, "*"), Some("delete_repository"));
        assert_eq!(b.refused_besides(&p, "delete_repository"), None);
        // Other methods are not calls.
        let list = read(br#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#).unwrap();
        assert_eq!((list.refused(&p), list.tools().len()), (None, 0));
        let answer = read(br#"{"jsonrpc":"2.0","id":6,"result":{}}"#).unwrap();
        assert_eq!(answer.refused(&p), None);
    }

    #[test]
    fn what_is_not_json_rpc_is_not_read_as_if_it_were() {
        for body in [
            &b"not json"[..],
            b"[]",
            b"[1]",
            br#"{"id":1,"method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
            // Read as another call by a parser that keeps the first of two keys.
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_repository","name":"search_issues"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{"name":"x"}}"#,
            // Read otherwise by a parser that ignores case (Go's encoding/json, C#'s web defaults).
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_issues","Name":"delete_repository"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":null,"METHOD":"tools/call","params":{"name":"x"}}"#,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"search_x\"},\"param\u{17f}\":{\"name\":\"x\"}}".as_bytes(),
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"NAME":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#,
        ] {
            assert!(read(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_refusal_answers_each_request_of_the_body_and_names_the_line_on_the_refused_one() {
        let b = read(format!("[{},{}]", call(1, "search_issues"), call(2, "delete_repository")).as_bytes())
            .unwrap();
        let body = b.refusal("delete_repository", "add \"rule = h mcp /mcp delete_repository\"").unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        let errs = v.as_array().unwrap();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[1]["id"], 2);
        assert_eq!(errs[1]["error"]["code"], -32001, "the code docs/networking.md gives");
        assert!(
            errs[1]["error"]["message"].as_str().unwrap().contains("rule = h mcp /mcp delete_repository")
        );
        assert!(errs[0]["error"]["message"].as_str().unwrap().starts_with("not sent"));
        // One message: one object, with its own id as it was (a string here).
        let one = read(br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#).unwrap();
        let v: Value = serde_json::from_slice(&one.refusal("x", "no").unwrap()).unwrap();
        assert_eq!((v["id"].as_str(), v["error"]["message"].as_str()), (Some("a"), Some("no")));
        let note = read(br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#).unwrap();
        assert_eq!(note.refusal("x", "no"), None);
    }

    const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_issues"},{"name":"create_issue"},{"name":"delete_repository"},{"title":"no name"}]}}"#;

    #[test]
    fn a_tools_list_shows_only_the_allowed_tools_and_anything_else_passes_as_it_came() {
        let p = pats(&["search_*", "create_issue"]);
        let (out, n) = filter_json(LIST.as_bytes(), &p).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((names(&v), n), (vec!["search_issues".to_string(), "create_issue".into()], 2));
        let batch = format!("[{LIST},{LIST}]");
        assert_eq!(filter_json(batch.as_bytes(), &p).unwrap().1, 4);
        // Nothing removed: the bytes as they came (spacing and order kept).
        let other = br#"{ "jsonrpc":"2.0", "id":2, "result": {"content": [{"type":"text","text":"ok"}]} }"#;
        assert_eq!(filter_json(other, &p).unwrap(), (other.to_vec(), 0));
        // Not JSON: refused where it could list tools, passed where it could not.
        assert!(filter_json(b"<html>tools", &p).is_err());
        assert!(filter_json("{\"\\u0074ools\":[]".as_bytes(), &p).is_err());
        assert!(filter_json(b"{\0\"\0t\0o\0o\0l\0s", &p).is_err(), "UTF-16");
        assert_eq!(filter_json(b"<html>", &p).unwrap(), (b"<html>".to_vec(), 0));
        // An escaped key is read as the client reads it.
        let escaped = r#"{"jsonrpc":"2.0","id":1,"result":{"\u0074ools":[{"name":"delete_repository"}]}}"#;
        assert_eq!(filter_json(escaped.as_bytes(), &p).unwrap().1, 1);
        assert_eq!(filter_json(b"", &p).unwrap(), (Vec::new(), 0));
    }

    /// `stream` through `Events` in pieces of `cut` bytes, then its end: what comes out, and how
    /// many tools it hid.
    fn in_pieces(stream: &str, cut: usize, p: &[String]) -> (String, usize) {
        let mut e = Events::default();
        let mut out = Vec::new();
        for piece in stream.as_bytes().chunks(cut) {
            out.extend(e.push(piece, p).unwrap());
        }
        out.extend(e.end(p).unwrap());
        (String::from_utf8(out).unwrap(), e.hidden)
    }

    #[test]
    fn an_event_stream_is_filtered_event_by_event_however_it_is_cut() {
        let p = pats(&["search_*"]);
        let stream = format!(
            "event: message\r\nid: 7\r\ndata: {LIST}\r\n\r\n: a comment\n\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}}\n\n"
        );
        for cut in [1, 7, 64, stream.len()] {
            let (text, hidden) = in_pieces(&stream, cut, &p);
            assert_eq!(hidden, 3, "cut {cut}");
            assert!(text.starts_with("event: message\nid: 7\ndata: {"), "{text}");
            assert!(text.contains("search_issues") && !text.contains("delete_repository"), "{text}");
            assert!(text.ends_with(
                ": a comment\n\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
            ));
        }
        // An event cut off by the stream's end is still read, and filtered.
        let mut e = Events::default();
        let out = [e.push(format!("data: {LIST}").as_bytes(), &p).unwrap(), e.end(&p).unwrap()].concat();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("search_issues") && !out.contains("create_issue"), "{out}");
        // A complete event goes at once, however short, and a byte-order mark as soon as it is
        // whole (nothing is held that a client is waiting for).
        let mut e = Events::default();
        assert_eq!(e.push(b"\n\n", &p).unwrap(), b"\n\n");
        let mut e = Events::default();
        assert_eq!(e.push(BOM, &p).unwrap(), BOM);
        assert_eq!(e.push(b"\n\n", &p).unwrap(), b"\n\n");
        // Data split over lines is one message; data that is not JSON is refused.
        let mut e = Events::default();
        let split =
            "data: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{\"tools\":[{\"name\":\"x\"}]}}\n\n";
        assert!(!String::from_utf8(e.push(split.as_bytes(), &p).unwrap()).unwrap().contains("\"x\""));
        assert!(Events::default().push(b"data: <html> tools\n\n", &p).is_err());
        // A field that only starts with `data` is another field: a client reads no data from it.
        let other = b"datum: <html> tools\ndata:\n\n";
        assert_eq!(Events::default().push(other, &p).unwrap(), other.to_vec());
        let endpoint = b"event: endpoint\ndata: /messages?session=1\n\n";
        assert_eq!(Events::default().push(endpoint, &p).unwrap(), endpoint.to_vec(), "lists nothing");
    }

    /// Every way the event stream format ends a line, a byte-order mark at the start, and an
    /// event cut anywhere: each event read as a client reads it.
    #[test]
    fn an_events_lines_end_as_the_format_says_and_a_bom_starts_no_line() {
        let p = pats(&["search_*"]);
        for (start, blank) in [
            ("", "\n\n"),
            ("", "\r\r"),
            ("", "\r\n\r\n"),
            ("", "\n\r\n"),
            ("", "\r\n\r"),
            ("\u{feff}", "\n\n"),
        ] {
            let stream = format!("{start}data: {LIST}{blank}data: {LIST}{blank}");
            for cut in [1, 2, 3, 5, stream.len()] {
                let (text, hidden) = in_pieces(&stream, cut, &p);
                assert_eq!(hidden, 6, "{start:?} {blank:?} cut {cut}: {text:?}");
                assert!(!text.contains("delete_repository"), "{text:?}");
            }
        }
    }

    #[test]
    fn an_event_is_held_up_to_the_limit_and_not_a_byte_more() {
        let mut e = Events::default();
        assert_eq!(e.push(&vec![b'a'; ANSWER_MOST], &pats(&["*"])).unwrap(), b"");
        assert_eq!(e.holding(), ANSWER_MOST);
        assert!(e.push(b"a", &pats(&["*"])).is_err());
    }

    #[test]
    fn an_event_that_never_ends_is_refused_past_the_limit() {
        let mut e = Events::default();
        let chunk = vec![b'a'; 1 << 20];
        let mut failed = false;
        for _ in 0..=(ANSWER_MOST >> 20) {
            if e.push(&chunk, &pats(&["*"])).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
