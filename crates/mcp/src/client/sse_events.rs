//! Server-sent events from an HTTP server, read with the same screen as a stdio server's lines.
//!
//! rmcp parses each event's `data` as a JSON-RPC message. An event past codemode's bounds (16
//! MiB, 127 levels, 2^20 values) would cost the host far more than its bytes to parse, and one
//! rmcp cannot read is skipped, so its request waits for its timeout. This reader parses the
//! event stream itself, feeding each event's data through a [`Scanner`] as it arrives: an event
//! past a bound keeps no data (constant memory however long it runs), and a response among them
//! is replaced by a JSON-RPC error for its request, sent as soon as its `id` is known.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{BoxStream, Stream, StreamExt};
use rmcp::transport::streamable_http_client::SseError;
use serde_json::Value;
use sse_stream::Sse;

use super::screen::{Scanner, cut, error_response, read_envelope, refusal, unreadable};

/// The longest field name kept (`event`, `retry`); a longer one is ignored.
const MAX_FIELD_NAME: usize = 16;
/// The longest `event`, `id` or `retry` value kept; a longer one is ignored.
const MAX_FIELD_VALUE: usize = 4096;
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Reads `bytes` as an event stream, screening each event's data (at most `max_event` bytes).
/// `request` is the id of the request whose answer the stream carries (a POST's): a refused
/// answer whose own id cannot be read answers for it, rather than leave it to its timeout.
pub(crate) fn screened_events<S, B, E>(
    server: Arc<str>,
    bytes: S,
    max_event: usize,
    request: Option<Value>,
) -> BoxStream<'static, Result<Sse, SseError>>
where
    S: Stream<Item = Result<B, E>> + Send + 'static,
    B: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut reader = EventReader::new(server, max_event);
    reader.request = request;
    futures::stream::unfold(
        (Box::pin(bytes), reader, false),
        |(mut bytes, mut reader, mut done)| async move {
            loop {
                if let Some(event) = reader.out.pop_front() {
                    return Some((Ok(event), (bytes, reader, done)));
                }
                if done {
                    return None;
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => reader.feed(chunk.as_ref()),
                    Some(Err(e)) => {
                        done = true;
                        return Some((Err(SseError::Body(Box::new(e))), (bytes, reader, done)));
                    }
                    // An event not ended by a blank line is discarded, as the format says.
                    None => done = true,
                }
            }
        },
    )
    .boxed()
}

struct EventReader {
    server: Arc<str>,
    max_event: usize,
    /// The request the stream answers, if it is a POST's.
    request: Option<Value>,
    /// Bytes of a leading byte-order mark skipped so far, until the first other byte (`None`).
    bom: Option<usize>,
    /// The field name read so far on this line.
    field: Vec<u8>,
    field_too_long: bool,
    /// Past the line's first colon: reading the value.
    in_value: bool,
    /// The value's first byte, if a space, is not part of it.
    at_value_start: bool,
    /// The value of a field other than `data`.
    value: Vec<u8>,
    value_too_long: bool,
    /// The line is a comment (it began with a colon).
    comment: bool,
    previous_was_cr: bool,
    pending: Pending,
    out: VecDeque<Sse>,
}

impl EventReader {
    fn new(server: Arc<str>, max_event: usize) -> Self {
        EventReader {
            server,
            max_event,
            request: None,
            bom: Some(0),
            field: Vec::new(),
            field_too_long: false,
            in_value: false,
            at_value_start: false,
            value: Vec::new(),
            value_too_long: false,
            comment: false,
            previous_was_cr: false,
            pending: Pending::default(),
            out: VecDeque::new(),
        }
    }

    fn feed(&mut self, mut chunk: &[u8]) {
        while let (Some(seen), Some(&b)) = (self.bom, chunk.first()) {
            // A mark cut short is not UTF-8 either: its bytes are dropped too.
            self.bom = (seen < BOM.len() && b == BOM[seen]).then_some(seen + 1);
            if self.bom.is_some() {
                chunk = &chunk[1..];
            }
        }
        while !chunk.is_empty() {
            if std::mem::take(&mut self.previous_was_cr) && chunk[0] == b'\n' {
                chunk = &chunk[1..];
                continue;
            }
            let end = chunk
                .iter()
                .position(|b| matches!(b, b'\r' | b'\n'))
                .unwrap_or(chunk.len());
            self.run(&chunk[..end]);
            if end == chunk.len() {
                break;
            }
            self.previous_was_cr = chunk[end] == b'\r';
            self.end_line();
            chunk = &chunk[end + 1..];
        }
        self.answer_early();
    }

    /// Bytes of one line, without its end.
    fn run(&mut self, mut bytes: &[u8]) {
        if !self.in_value {
            if self.field.is_empty() && !self.field_too_long && bytes.first() == Some(&b':') {
                self.comment = true;
            }
            if self.comment {
                return;
            }
            let colon = bytes.iter().position(|b| *b == b':');
            let name = &bytes[..colon.unwrap_or(bytes.len())];
            if self.field.len() + name.len() > MAX_FIELD_NAME {
                self.field_too_long = true;
            } else {
                self.field.extend_from_slice(name);
            }
            let Some(colon) = colon else { return };
            self.in_value = true;
            self.at_value_start = true;
            if self.is_data() {
                self.pending.start_data_line();
            }
            bytes = &bytes[colon + 1..];
        } else if self.comment {
            return;
        }
        if bytes.is_empty() {
            return;
        }
        if std::mem::take(&mut self.at_value_start) && bytes[0] == b' ' {
            bytes = &bytes[1..];
        }
        if self.is_data() {
            self.pending.push_data(bytes, self.max_event);
        } else if self.value.len() + bytes.len() > MAX_FIELD_VALUE {
            self.value_too_long = true;
        } else if !self.value_too_long {
            self.value.extend_from_slice(bytes);
        }
    }

    fn is_data(&self) -> bool {
        !self.field_too_long && self.field == b"data"
    }

    fn end_line(&mut self) {
        let blank = self.field.is_empty() && !self.field_too_long && !self.comment;
        if blank && !self.in_value {
            let pending = std::mem::take(&mut self.pending);
            if let Some(event) = pending.finish(&self.server, self.max_event, self.request.as_ref())
            {
                self.out.push_back(event);
            }
        } else if !self.comment && !self.field_too_long {
            if !self.in_value && self.field == b"data" {
                // `data` with no colon: an empty data line.
                self.pending.start_data_line();
            }
            let value = (!self.value_too_long)
                .then(|| String::from_utf8(std::mem::take(&mut self.value)).ok())
                .flatten();
            match (self.field.as_slice(), value) {
                (b"event", Some(value)) => self.pending.event = Some(value),
                (b"id", Some(value)) if !value.contains('\0') => self.pending.id = Some(value),
                (b"retry", Some(value)) if value.bytes().all(|b| b.is_ascii_digit()) => {
                    self.pending.retry = value.parse().ok();
                }
                _ => {}
            }
        }
        self.field.clear();
        self.field_too_long = false;
        self.in_value = false;
        self.at_value_start = false;
        self.value.clear();
        self.value_too_long = false;
        self.comment = false;
    }

    /// A response past a bound is answered for as soon as its id is known: the rest of its
    /// event may come much later, or never, and its call would wait for its timeout.
    fn answer_early(&mut self) {
        let pending = &mut self.pending;
        if pending.answered || !pending.is_message() {
            return;
        }
        let Some(why) = refusal(&pending.scanner, pending.oversized, self.max_event) else {
            return;
        };
        let scanner = &pending.scanner;
        let own = own_id(scanner);
        let id_pending = scanner.id_started() && !scanner.id_complete() && !scanner.id_lost();
        let id = if pending.oversized {
            // The event holds its stream up for as long as it runs: answered for now.
            answers_for(own, true, true, self.request.as_ref())
        } else if scanner.has_outcome() && !id_pending {
            answers_for(own, true, false, self.request.as_ref())
        } else {
            // Its id may still come.
            None
        };
        let Some(id) = id else {
            return;
        };
        pending.answered = true;
        tracing::warn!(server = %self.server, %id, "MCP server response refused: {why}");
        self.out.push_back(Sse {
            event: None,
            data: Some(error_response(id, &why).to_string()),
            id: None,
            retry: None,
        });
    }
}

/// The request a refused message is answered for, if any: its own id (`own`, for a message that
/// reads as an answer, with a top-level `result` or `error`), unless it is on a POST's stream
/// and names another request (rmcp stops reading a POST's stream at the first answer it is
/// given, so an error for that id would cost the POST's request its real answer: it is
/// dropped). With no id of its own, an answer on a POST's stream, or anything there past the
/// size bound (which holds the stream up), answers for the POST's request.
fn answers_for(
    own: Option<Value>,
    reads_as_answer: bool,
    oversized: bool,
    request: Option<&Value>,
) -> Option<Value> {
    match (own, request) {
        (Some(own), Some(request)) if !same_id(&own, request) => None,
        (Some(own), _) => Some(own),
        (None, Some(request)) if reads_as_answer || oversized => Some(request.clone()),
        (None, _) => None,
    }
}

/// The message's own id, read whole, when the message may be an answer (a top-level `result`
/// or `error`, or no `method`) and rmcp takes the id (`3.0` is `3`; `3.5` and ids past i64
/// name no request), in the form rmcp gives it.
fn own_id(scanner: &Scanner) -> Option<Value> {
    let is_request = scanner.has_method() && !scanner.has_outcome();
    if is_request || !scanner.id_complete() {
        return None;
    }
    let id = serde_json::from_value::<rmcp::model::RequestId>(scanner.id_value()?).ok()?;
    serde_json::to_value(id).ok()
}

/// Ids as rmcp matches them: `3` and `"3"` name the same request.
fn same_id(a: &Value, b: &Value) -> bool {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    a == b || text(a) == text(b)
}

/// The event being read.
#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    has_data: bool,
    scanner: Scanner,
    /// Its data passed the size bound.
    oversized: bool,
    /// Its data passed a bound: what was kept of it is dropped, and no more is kept.
    dropped: bool,
    /// Its request was already answered with an error.
    answered: bool,
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
}

impl Pending {
    /// rmcp reads events of no type, or of type `message`, as messages.
    fn is_message(&self) -> bool {
        matches!(self.event.as_deref(), None | Some("") | Some("message"))
    }

    fn start_data_line(&mut self) {
        if self.has_data {
            self.push_data(b"\n", usize::MAX);
        }
        self.has_data = true;
    }

    fn push_data(&mut self, bytes: &[u8], max_event: usize) {
        self.scanner.feed(bytes);
        if self.dropped {
            return;
        }
        self.oversized = self.data.len().saturating_add(bytes.len()) > max_event;
        if self.oversized || refusal(&self.scanner, false, max_event).is_some() {
            self.dropped = true;
            self.data = Vec::new();
        } else {
            self.data.extend_from_slice(bytes);
        }
    }

    /// The event to hand rmcp, if any: its data screened, refused or checked.
    fn finish(mut self, server: &str, max_event: usize, request: Option<&Value>) -> Option<Sse> {
        if !self.has_data && self.event.is_none() && self.id.is_none() && self.retry.is_none() {
            return None;
        }
        let data = if !self.has_data || self.answered {
            None
        } else if !self.is_message() {
            // Another kind of event (rmcp's to handle): only its size is bounded.
            (!self.dropped)
                .then(|| String::from_utf8(self.data).ok())
                .flatten()
        } else if let Some(why) = refusal(&self.scanner, self.oversized, max_event) {
            self.refused(server, &why, request)
        } else {
            self.checked(server, request)
        };
        if data.is_none() && self.id.is_none() && self.retry.is_none() {
            return None;
        }
        Some(Sse {
            event: self.event,
            data,
            id: self.id,
            retry: self.retry,
        })
    }

    /// A top-level `result` or `error`, or an id and no `method`: what can only be an answer.
    fn reads_as_answer(&self) -> bool {
        self.scanner.has_outcome() || self.scanner.response_id().is_some()
    }

    /// The error that answers for a refused message (see [`answers_for`]), or nothing.
    fn refused(&self, server: &str, why: &str, request: Option<&Value>) -> Option<String> {
        let reads_as_answer = self.reads_as_answer();
        let Some(id) = answers_for(
            own_id(&self.scanner),
            reads_as_answer,
            self.oversized,
            request,
        ) else {
            tracing::warn!(%server, "MCP server event dropped: {why} (it answers no request of this stream)");
            return None;
        };
        tracing::warn!(%server, %id, "MCP server response refused: {why}");
        Some(error_response(id, why).to_string())
    }

    /// An answer rmcp could not read (see [`read_envelope`]) becomes an error for its request,
    /// which would otherwise wait for its timeout, and so does an error that names no request,
    /// on a POST's stream. What does not read as an answer (requests, notifications, priming
    /// events, text) is passed on as it is: rmcp skips what it cannot read, and nothing waits
    /// for it.
    fn checked(&mut self, server: &str, request: Option<&Value>) -> Option<String> {
        if !self.reads_as_answer() {
            return String::from_utf8(std::mem::take(&mut self.data)).ok();
        }
        match read_envelope(&self.data, &self.scanner) {
            Ok(envelope) => match (envelope.id, envelope.error, request) {
                (None, Some(said), Some(request)) => {
                    let why = format!(
                        "the server answered with an error that names no request: {}",
                        cut(&said)
                    );
                    tracing::warn!(%server, id = %request, "MCP server error answered for: {why}");
                    Some(error_response(request.clone(), &why).to_string())
                }
                _ => String::from_utf8(std::mem::take(&mut self.data)).ok(),
            },
            Err(problem) => self.refused(server, &unreadable(problem), request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The events read from `input`, fed `step` bytes at a time.
    fn read(input: &[u8], step: usize, max_event: usize) -> Vec<Sse> {
        let mut reader = EventReader::new("t".into(), max_event);
        for chunk in input.chunks(step.max(1)) {
            reader.feed(chunk);
        }
        reader.out.into_iter().collect()
    }

    fn data(events: &[Sse]) -> Vec<Option<String>> {
        events.iter().map(|e| e.data.clone()).collect()
    }

    #[test]
    fn reads_the_event_stream_format_however_it_is_cut() {
        let input = b"\xEF\xBB\xBF: a comment\r\nevent: message\r\nid: 7\r\nretry: 1500\r\ndata: {\"a\":\r\ndata:1}\r\n\r\n\
                      data:x\rdata\r\r\
                      data: y\n: comment between\nunknown: z\n\n\
                      id: 9\n\n\
                      data: not ended";
        for step in 1..=input.len() {
            let events = read(input, step, 1 << 20);
            assert_eq!(events.len(), 4, "step {step}");
            assert_eq!(events[0].event.as_deref(), Some("message"));
            assert_eq!(events[0].id.as_deref(), Some("7"));
            assert_eq!(events[0].retry, Some(1500));
            assert_eq!(
                data(&events),
                [
                    Some("{\"a\":\n1}".to_owned()),
                    Some("x\n".to_owned()),
                    Some("y".to_owned()),
                    None
                ],
                "step {step}"
            );
            assert_eq!(events[3].id.as_deref(), Some("9"));
        }
    }

    fn refusal_of(event: &Sse) -> (Value, String) {
        let v: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        (
            v["id"].clone(),
            v["error"]["message"].as_str().unwrap().to_owned(),
        )
    }

    /// 15 MiB of zeros: within the byte bound, far past the values one.
    #[test]
    fn a_response_of_too_many_values_is_answered_with_an_error_and_keeps_no_data() {
        let zeros = vec!["0"; 7 << 20].join(",");
        let event =
            format!("data: {{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{{\"v\":[{zeros}]}}}}\n\n");
        let mut reader = EventReader::new("t".into(), 16 << 20);
        let mut kept = 0;
        for chunk in event.as_bytes().chunks(64 * 1024) {
            reader.feed(chunk);
            kept = kept.max(reader.pending.data.capacity());
        }
        assert!(kept < 4 << 20, "data kept past the bound: {kept}");
        let events: Vec<Sse> = reader.out.into_iter().collect();
        assert_eq!(
            events.len(),
            1,
            "one answer, sent early, none at the event's end"
        );
        let (id, why) = refusal_of(&events[0]);
        assert_eq!(id, json!(4));
        assert!(why.contains("more than 1048576 JSON values"), "{why}");
    }

    #[test]
    fn an_oversized_or_too_deep_response_is_answered_for_and_a_notification_dropped() {
        let big = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"id\":\"b\",\"result\":{{\"t\":\"{}\"}}}}\n\n",
            "x".repeat(2000)
        );
        let events = read(big.as_bytes(), 100, 1000);
        assert_eq!(events.len(), 1);
        let (id, why) = refusal_of(&events[0]);
        assert_eq!(id, json!("b"));
        assert!(why.contains("larger than 1000 bytes"), "{why}");

        let deep = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}{}}}\n\n",
            "[".repeat(200),
            "]".repeat(200)
        );
        let (id, why) = refusal_of(&read(deep.as_bytes(), 7, 1 << 20)[0]);
        assert_eq!(id, json!(2));
        assert!(
            why.contains("200 levels deep") || why.contains("levels deep"),
            "{why}"
        );

        let wide_note = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":[{}]}}\n\n",
            "[".repeat(200) + &"]".repeat(200)
        );
        assert!(read(wide_note.as_bytes(), 64, 1 << 20).is_empty());
    }

    /// An event that never ends still answers its request, and keeps nothing of what follows.
    #[test]
    fn an_endless_event_is_answered_for_as_soon_as_its_id_is_read() {
        let mut reader = EventReader::new("t".into(), 1 << 20);
        reader.feed(b"data: {\"jsonrpc\":\"2.0\",\"id\":11,\"result\":{\"t\":\"");
        for _ in 0..40 {
            reader.feed(&[b'x'; 64 * 1024]);
        }
        assert_eq!(reader.out.len(), 1);
        assert_eq!(refusal_of(&reader.out[0]).0, json!(11));
        assert_eq!(reader.pending.data.capacity(), 0);
    }

    #[test]
    fn a_response_rmcp_could_not_read_becomes_an_error_for_its_request() {
        for (line, problem) in [
            (
                "{\"jsonrpc\":\"2.0\",\"id\":5}",
                "neither a result nor an error",
            ),
            (
                "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{",
                "EOF while parsing",
            ),
            (
                "{\"jsonrpc\":\"1.0\",\"id\":5,\"result\":{}}",
                "not \"2.0\"",
            ),
        ] {
            let events = read(format!("data: {line}\n\n").as_bytes(), 3, 1 << 20);
            let (id, why) = refusal_of(&events[0]);
            assert_eq!(id, json!(5));
            assert!(why.contains(problem), "{why}");
        }
        // Not an answer: passed on as it is (rmcp skips what it cannot read).
        assert_eq!(
            data(&read(b"data: hello\n\n", 2, 1 << 20)),
            [Some("hello".to_owned())]
        );
        // Another kind of event is rmcp's to handle: passed on unscreened but bounded.
        let events = read(b"event: endpoint\ndata: /messages?x=1\n\n", 4, 1 << 20);
        assert_eq!(events[0].event.as_deref(), Some("endpoint"));
        assert_eq!(data(&events), [Some("/messages?x=1".to_owned())]);
    }

    /// On a POST's stream, an answer that cannot be read and names no id of its own answers
    /// for the POST's request: its id repeated, coming after an endless result, or two messages
    /// in one event.
    #[test]
    fn on_a_posts_stream_an_unreadable_answer_answers_for_its_request() {
        let post = |input: &[u8]| {
            let mut reader = EventReader::new("t".into(), 1 << 20);
            reader.request = Some(json!(9));
            for chunk in input.chunks(1000) {
                reader.feed(chunk);
            }
            reader.out.into_iter().collect::<Vec<Sse>>()
        };
        let two = b"data: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\n\n";
        let (id, why) = refusal_of(&post(two)[0]);
        assert_eq!(id, json!(9));
        assert!(why.contains("trailing"), "{why}");
        // Not an answer (a priming event's empty data, text): passed on, answering nothing.
        assert_eq!(
            data(&post(b"id: p1\ndata: \n\ndata: hello\n\n")),
            [Some(String::new()), Some("hello".to_owned())]
        );
        let twice = b"data: {\"jsonrpc\":\"2.0\",\"id\":5,\"id\":5,\"result\":{}}\n\n";
        let (id, why) = refusal_of(&post(twice)[0]);
        assert_eq!(id, json!(9));
        assert!(why.contains("duplicate field"), "{why}");
        // The id would come after the result, which never ends: answered once past the bound.
        let mut endless = b"data: {\"jsonrpc\":\"2.0\",\"result\":{\"t\":\"".to_vec();
        endless.extend(std::iter::repeat_n(b'x', 2 << 20));
        let events = post(&endless);
        assert_eq!(events.len(), 1);
        let (id, why) = refusal_of(&events[0]);
        assert_eq!(id, json!(9));
        assert!(why.contains("larger than 1 MiB"), "{why}");
        // An unreadable answer for another request is dropped: the real answer that follows
        // must reach rmcp.
        let other = b"data: {\"jsonrpc\":\"1.0\",\"id\":1009,\"result\":{}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"9\",\"result\":{}}\n\n";
        assert_eq!(
            data(&post(other)),
            [Some(r#"{"jsonrpc":"2.0","id":"9","result":{}}"#.to_owned())]
        );
        // An error that names no request is this request's answer, with what the server said.
        let (id, why) = refusal_of(&post(b"data: {\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}\n\n")[0]);
        assert_eq!(id, json!(9));
        assert!(why.contains("names no request: Parse error"), "{why}");
        // A lone surrogate, which serde_json refuses to read as a string.
        let (id, why) = refusal_of(
            &post(b"data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"t\":\"\\ud83d\"}}\n\n")[0],
        );
        assert_eq!(id, json!(9));
        assert!(why.contains("lone UTF-16 surrogate"), "{why}");
        // A request from the server that never ends holds the stream up: answered for.
        let mut endless =
            b"data: {\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"ping\",\"params\":{\"p\":\""
                .to_vec();
        endless.extend(std::iter::repeat_n(b'x', 2 << 20));
        let (id, why) = refusal_of(&post(&endless)[0]);
        assert_eq!(id, json!(9));
        assert!(why.contains("larger than 1 MiB"), "{why}");
        // Ids rmcp does not take name no request: the answer is this request's.
        for id in ["18446744073709551615", "3.5"] {
            let line = format!("data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{}}}}\n\n");
            let (answered, why) = refusal_of(&post(line.as_bytes())[0]);
            assert_eq!(answered, json!(9), "{id}");
            assert!(why.contains("not a JSON-RPC response"), "{why}");
        }
        // `9.0` is rmcp's 9: an unreadable answer for it is this request's.
        let nine = b"data: {\"jsonrpc\":\"1.0\",\"id\":9.0,\"result\":{}}\n\n";
        assert_eq!(refusal_of(&post(nine)[0]).0, json!(9));
        // Its id, then whitespace or a key that never ends: answered once past the size bound.
        for head in [
            &b"data: {\"jsonrpc\":\"2.0\",\"id\":9"[..],
            b"data: {\"jsonrpc\":\"2.0\",\"id\":9,\"",
        ] {
            let mut endless = head.to_vec();
            let filler = if head.ends_with(b"\"") { b'k' } else { b' ' };
            endless.extend(std::iter::repeat_n(filler, 2 << 20));
            let events = post(&endless);
            assert_eq!(events.len(), 1, "{}", String::from_utf8_lossy(head));
            let (id, why) = refusal_of(&events[0]);
            assert_eq!(id, json!(9));
            assert!(why.contains("larger than 1 MiB"), "{why}");
        }
        // A notification is not an answer: dropped, never answered for.
        let note = format!(
            "data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}{}}}\n\n",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(post(note.as_bytes()).is_empty());
    }

    #[test]
    fn a_valid_answer_passes_unchanged() {
        let line = json!({"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": "a\nb"}]}}).to_string();
        let events = read(format!("id: e1\ndata: {line}\n\n").as_bytes(), 5, 1 << 20);
        assert_eq!(data(&events), [Some(line)]);
        assert_eq!(events[0].id.as_deref(), Some("e1"));
    }

    /// Field names and values other than data are bounded too.
    #[test]
    fn long_field_lines_are_ignored_not_kept() {
        let mut input = b"id: ".to_vec();
        input.extend(std::iter::repeat_n(b'9', 1 << 20));
        input.extend(b"\n");
        input.extend(std::iter::repeat_n(b'f', 1 << 20));
        input.extend(b": v\ndata: ok\n\n");
        let events = read(&input, 4096, 1 << 20);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, None);
        assert_eq!(data(&events), [Some("ok".to_owned())]);
    }
}
