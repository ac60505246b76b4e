//! Screening a server's messages (a stdio server's lines, an HTTP server's bodies and events)
//! before rmcp reads them.
//!
//! rmcp drops a message longer than its limit, and one its JSON parser refuses (serde_json stops
//! at 127 levels of nesting), with only a log line: the request it answered then waits for its
//! timeout. This scanner sees each message as it streams past, in constant memory, and records
//! what is needed to fail that request at once instead: how deep the message nests, how many JSON
//! values it holds, and the top-level `id` and whether there is a `method` (a response has an
//! `id` and no `method`).
//!
//! The count matters because parsing costs memory by values, not bytes: 15 MiB of `[0,0,…]` is
//! 7.5 million values, which rmcp's parser (an untagged enum, buffered and copied per variant
//! tried) took to over 2 GB for a few answers in flight. A line past [`MAX_VALUES`] is never
//! parsed.

use rmcp::service::{RoleClient, RxJsonRpcMessage};

/// The most nesting serde_json's parser accepts (its recursion limit of 128 counts one more).
pub(crate) const MAX_DEPTH: usize = 127;

/// The most JSON values one message may hold, object keys counted as values: the same bound the
/// host puts on what it decodes from a script. A 16 MiB message of ordinary JSON (8 or more
/// bytes a value) stays within it; 2 bytes a value (`[0,0,…]`) does not.
pub(crate) const MAX_VALUES: usize = 1 << 20;

/// A top-level `id` longer than this is not kept (ids are numbers or short strings).
const MAX_ID_LEN: usize = 256;

/// The longest top-level key kept, as written: `"\u0072\u0065…"` spells `result` in 36 bytes.
const MAX_KEY_LEN: usize = 64;

/// Which of the keys that matter `raw` (a key as written, escapes and all) is.
fn top_key(raw: &[u8]) -> TopKey {
    let decoded;
    let key = if raw.contains(&b'\\') && raw.len() <= MAX_KEY_LEN {
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(raw);
        quoted.push(b'"');
        decoded = serde_json::from_slice::<String>(&quoted).unwrap_or_default();
        decoded.as_bytes()
    } else {
        raw
    };
    match key {
        b"id" => TopKey::Id,
        b"method" => TopKey::Method,
        b"result" | b"error" => TopKey::Outcome,
        _ => TopKey::Other,
    }
}

pub(crate) struct Scanner {
    depth: usize,
    deepest: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// The key being read at depth 1 (only short keys matter).
    key: Vec<u8>,
    reading_key: bool,
    /// The last top-level key read, while its value is read.
    current: Option<TopKey>,
    id: Vec<u8>,
    id_overflow: bool,
    /// The top-level `id`'s value has been read to its end.
    id_done: bool,
    has_method: bool,
    /// A top-level `result` or `error` key was read: the line is a response.
    has_outcome: bool,
    /// Values seen (strings, keys included, containers and scalars).
    values: usize,
    /// Inside a `\u` escape: the hex digits read, and their value so far.
    hex: Option<(u8, u32)>,
    /// The last escape was a high surrogate, waiting for its low one.
    high_surrogate: bool,
    bad_escape: bool,
    /// The last byte outside strings, bar whitespace, began a line, a container or a member:
    /// the next scalar byte starts a value.
    value_next: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            depth: 0,
            deepest: 0,
            in_string: false,
            escaped: false,
            expect_key: false,
            key: Vec::new(),
            reading_key: false,
            current: None,
            id: Vec::new(),
            id_overflow: false,
            id_done: false,
            has_method: false,
            has_outcome: false,
            values: 0,
            value_next: true,
            hex: None,
            high_surrogate: false,
            bad_escape: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Id,
    Method,
    Outcome,
    Other,
}

impl Scanner {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.depth == 1 && self.current == Some(TopKey::Id) && !self.reading_key {
            let ends = !self.in_string && (b == b',' || b == b'}');
            // Whitespace outside a string is not part of the id (a server could pad past the
            // bound on what is kept, and the id would be lost).
            let padding = !self.in_string && (b == b':' || b.is_ascii_whitespace());
            if !ends && !padding {
                if self.id.len() < MAX_ID_LEN {
                    self.id.push(b);
                } else {
                    self.id_overflow = true;
                }
            }
        }
        if self.in_string {
            self.track_surrogates(b);
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.reading_key {
                    self.reading_key = false;
                    self.current = Some(top_key(&self.key));
                    if self.current == Some(TopKey::Id) && !self.id.is_empty() {
                        // A second id (a repeated key, or a second message on the line): which
                        // one rmcp would take is not for the screen to guess.
                        self.id_overflow = true;
                    }
                    self.has_method |= self.current == Some(TopKey::Method);
                    self.has_outcome |= self.current == Some(TopKey::Outcome);
                }
                return;
            }
            if self.reading_key && self.key.len() <= MAX_KEY_LEN {
                self.key.push(b);
            }
            return;
        }
        if !matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
            let scalar = !matches!(b, b'"' | b'{' | b'[' | b'}' | b']' | b',' | b':');
            let starts = matches!(b, b'"' | b'{' | b'[') || (scalar && self.value_next);
            self.values += usize::from(starts);
            self.value_next = matches!(b, b'{' | b'[' | b',' | b':');
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.reading_key = true;
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.deepest = self.deepest.max(self.depth);
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.end_member();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.end_member();
            }
            _ => {}
        }
    }

    /// Follows `\uXXXX` escapes in strings: serde_json refuses a UTF-16 surrogate that is not
    /// one of a pair, and rmcp with it (`"😀".slice(0, 1)` in a Node server sends one).
    fn track_surrogates(&mut self, b: u8) {
        if let Some((digits, unit)) = self.hex {
            let Some(digit) = (b as char).to_digit(16) else {
                // Not an escape serde_json reads either.
                self.hex = None;
                self.bad_escape = true;
                return;
            };
            // At most four digits: the unit stays below 2^16.
            let unit = unit << 4 | digit;
            if digits == 3 {
                self.hex = None;
                self.code_unit(unit);
            } else {
                self.hex = Some((digits + 1, unit));
            }
        } else if self.escaped {
            if b == b'u' {
                self.hex = Some((0, 0));
            } else {
                self.no_low_surrogate();
            }
        } else if b != b'\\' {
            self.no_low_surrogate();
        }
    }

    fn code_unit(&mut self, unit: u32) {
        match unit {
            0xD800..=0xDBFF => {
                self.no_low_surrogate();
                self.high_surrogate = true;
            }
            0xDC00..=0xDFFF if self.high_surrogate => self.high_surrogate = false,
            0xDC00..=0xDFFF => self.bad_escape = true,
            _ => self.no_low_surrogate(),
        }
    }

    fn no_low_surrogate(&mut self) {
        if std::mem::take(&mut self.high_surrogate) {
            self.bad_escape = true;
        }
    }

    /// A string holds an escape serde_json refuses: a lone UTF-16 surrogate, or `\u` without
    /// four hex digits.
    pub(crate) fn bad_escape(&self) -> bool {
        self.bad_escape
    }

    fn end_member(&mut self) {
        self.id_done |= self.current == Some(TopKey::Id);
        self.current = None;
    }

    /// How deep the line nests.
    pub(crate) fn deepest(&self) -> usize {
        self.deepest
    }

    /// How many JSON values the line holds, object keys included.
    pub(crate) fn values(&self) -> usize {
        self.values
    }

    /// Some of a top-level `id` was read.
    pub(crate) fn id_started(&self) -> bool {
        !self.id.is_empty()
    }

    /// A top-level `id` was read to its end.
    pub(crate) fn id_complete(&self) -> bool {
        self.id_done
    }

    /// A top-level `id` was read that cannot be used: too long to keep, or given twice.
    pub(crate) fn id_lost(&self) -> bool {
        self.id_overflow
    }

    /// A top-level `result` or `error` key was read.
    pub(crate) fn has_outcome(&self) -> bool {
        self.has_outcome
    }

    /// A top-level `method` key was read: a request or a notification.
    pub(crate) fn has_method(&self) -> bool {
        self.has_method
    }

    /// The `id` of a response (a message with an `id` and no `method`), as JSON.
    pub(crate) fn response_id(&self) -> Option<serde_json::Value> {
        if self.has_method {
            return None;
        }
        self.id_value()
    }

    /// The top-level `id`, whatever the message is, when it is one number or string.
    pub(crate) fn id_value(&self) -> Option<serde_json::Value> {
        if self.id_overflow || self.id.is_empty() {
            return None;
        }
        let id: serde_json::Value = serde_json::from_slice(trim_end(&self.id)).ok()?;
        (id.is_string() || id.is_number()).then_some(id)
    }

    /// The `id` of a response, known before the line ends: its `id` was read whole and a
    /// top-level `result` or `error` key seen. A line past a bound can then be answered for at
    /// once, instead of when (or if ever) its newline arrives.
    pub(crate) fn early_response_id(&self) -> Option<serde_json::Value> {
        if !(self.id_done && self.has_outcome) {
            return None;
        }
        self.response_id()
    }
}

/// Why a message is refused unparsed, if it is: longer than `max_len` (`oversized`), deeper or
/// with more values than codemode reads.
pub(crate) fn refusal(scanned: &Scanner, oversized: bool, max_len: usize) -> Option<String> {
    if oversized {
        Some(format!(
            "the server's response was larger than {}, the most codemode reads in one message, \
             and was dropped; ask the tool for less (a smaller page, range or limit)",
            mib(max_len)
        ))
    } else if scanned.deepest() > MAX_DEPTH {
        Some(format!(
            "the server's response nests JSON {} levels deep, more than the {MAX_DEPTH} levels \
             codemode reads (the JSON-RPC envelope included), and was dropped",
            scanned.deepest()
        ))
    } else if scanned.values() > MAX_VALUES {
        // Counted only up to where it was refused, which may be before the line's end.
        Some(format!(
            "the server's response holds more than {MAX_VALUES} JSON values (object keys \
             included), the most codemode reads in one message, and was dropped; ask the tool \
             for less (a smaller page, range or limit)"
        ))
    } else {
        None
    }
}

/// Why an answer rmcp cannot read was dropped, in the words every transport uses.
pub(crate) fn unreadable(problem: impl std::fmt::Display) -> String {
    format!(
        "the server's answer is not a JSON-RPC response codemode can read ({problem}), and was \
         dropped; the fault is the server's, not the call's"
    )
}

/// The error that replaces a rejected response, when it answered a request.
pub(crate) fn rejected(
    server: &str,
    id: Option<serde_json::Value>,
    why: &str,
) -> Option<RxJsonRpcMessage<RoleClient>> {
    let Some(id) = id else {
        tracing::warn!(%server, "MCP server message dropped: {why} (it answered no request)");
        return None;
    };
    tracing::warn!(%server, %id, "MCP server response refused: {why}");
    serde_json::from_value(error_response(id, why)).ok()
}

pub(crate) fn mib(bytes: usize) -> String {
    if bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

/// A JSON-RPC error answering request `id`, saying `why` (an internal error: the fault is the
/// server's answer, not the request).
pub(crate) fn error_response(id: serde_json::Value, why: &str) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32603, "message": why },
    })
}

/// What a response's envelope says, read as rmcp reads it (without keeping its result).
pub(crate) struct Envelope {
    /// Its id; an error may have none (a server that could not read the request).
    pub(crate) id: Option<rmcp::model::RequestId>,
    /// The message of its error, if it is one.
    pub(crate) error: Option<String>,
}

/// `data` read as a JSON-RPC response the way rmcp reads one, or why rmcp could not read it:
/// not one JSON value, not JSON-RPC 2.0, an id rmcp does not take, both or neither of `result`
/// and `error`, an error without a numeric `code` and a `message`, or a `method` beside them.
/// Nothing of the result is kept. For answers rmcp parses itself, and skips, silently, when it
/// cannot: their request would wait for its timeout. `scanned` is the screen of the same data,
/// for what serde skips without reading (escapes in strings it ignores).
pub(crate) fn read_envelope(data: &[u8], scanned: &Scanner) -> Result<Envelope, String> {
    use serde::Deserialize;
    #[derive(Deserialize)]
    struct Raw {
        jsonrpc: String,
        #[serde(default)]
        id: Option<rmcp::model::RequestId>,
        #[serde(default, deserialize_with = "present")]
        result: bool,
        #[serde(default, deserialize_with = "error_field")]
        error: Option<Option<ErrorShape>>,
        #[serde(default, deserialize_with = "present")]
        method: bool,
    }
    #[derive(Deserialize)]
    struct ErrorShape {
        #[allow(dead_code)]
        code: i32,
        message: String,
    }
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| true)
    }
    fn error_field<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<ErrorShape>>, D::Error> {
        Option::<ErrorShape>::deserialize(d).map(Some)
    }
    let text = std::str::from_utf8(data).map_err(|e| format!("it is not UTF-8 ({e})"))?;
    if scanned.bad_escape() {
        return Err("a string in it holds a lone UTF-16 surrogate or a broken \\u escape".into());
    }
    let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let error = match raw.error {
        Some(None) => return Err("its error is null".into()),
        Some(Some(error)) => Some(error.message),
        None => None,
    };
    if raw.jsonrpc != "2.0" {
        Err(format!("its jsonrpc is {:?}, not \"2.0\"", raw.jsonrpc))
    } else if raw.method {
        Err("it has a method beside its result or error".into())
    } else if raw.result && error.is_some() {
        Err("it has both a result and an error".into())
    } else if !raw.result && error.is_none() {
        Err("it has neither a result nor an error".into())
    } else if raw.result && raw.id.is_none() {
        Err("its result has no id".into())
    } else {
        Ok(Envelope { id: raw.id, error })
    }
}

/// A server's own text in an error, at most 4 KiB of it.
pub(crate) fn cut(text: &str) -> String {
    const MAX: usize = 4096;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

fn trim_end(b: &[u8]) -> &[u8] {
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &b[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(line: &str) -> Scanner {
        let mut s = Scanner::default();
        // Fed in small pieces, as reads deliver them.
        for chunk in line.as_bytes().chunks(3) {
            s.feed(chunk);
        }
        s
    }

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn max_depth_is_exactly_serde_jsons_limit() {
        assert!(serde_json::from_str::<serde_json::Value>(&nested(MAX_DEPTH)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&nested(MAX_DEPTH + 1)).is_err());
        assert_eq!(scan(&nested(MAX_DEPTH + 1)).deepest(), MAX_DEPTH + 1);
    }

    #[test]
    fn finds_the_id_of_a_response_wherever_it_is() {
        let s = scan(r#"{"result":{"id":"inner","a":[{"id":9}]},"jsonrpc":"2.0","id":12}"#);
        assert_eq!(s.response_id(), Some(json!(12)));
        let s = scan(r#"{ "id" : "a,\"b}" , "result": {}}"#);
        assert_eq!(s.response_id(), Some(json!("a,\"b}")));
        assert_eq!(s.deepest(), 2);
    }

    #[test]
    fn brackets_inside_strings_do_not_nest() {
        let text = "[{".repeat(1000);
        let s = scan(&json!({"id": 1, "result": {"text": text}}).to_string());
        assert_eq!(s.deepest(), 2);
        assert_eq!(s.response_id(), Some(json!(1)));
    }

    /// Every value and key, whatever the spacing, never a byte inside a string.
    #[test]
    fn counts_values_and_keys() {
        for (line, values) in [
            ("0", 1),
            ("[]", 1),
            ("[0,0,0]", 4),
            (" [ 10 , -2.5e3 ,true,null ] ", 5),
            (r#"{"a":1,"b":[{},"x,y:[1]"]}"#, 7),
            (r#"{"id":1,"result":{"s":"\"[0,0]\""}}"#, 7),
            ("[[],[[]],{}]", 5),
        ] {
            assert_eq!(scan(line).values(), values, "{line}");
            let parsed: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(count(&parsed), values, "{line}");
        }
    }

    /// Values and keys as serde_json sees them, to check the scanner against.
    fn count(v: &serde_json::Value) -> usize {
        1 + match v {
            serde_json::Value::Array(a) => a.iter().map(count).sum(),
            serde_json::Value::Object(o) => o.values().map(|v| 1 + count(v)).sum(),
            _ => 0,
        }
    }

    #[test]
    fn a_responses_id_is_known_early_once_read_whole_with_its_result_key() {
        let early = |line: &str| scan(line).early_response_id();
        assert_eq!(
            early(r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"te"#),
            Some(json!(7))
        );
        assert_eq!(
            early(r#"{"id":"a","error":{"code":1,"message":"xx"#),
            Some(json!("a"))
        );
        assert_eq!(
            early(r#"{"result":{"x":1},"id":7"#),
            None,
            "the id may go on"
        );
        assert_eq!(
            early(r#"{"result":{"id":1,"x":[1,"#),
            None,
            "a nested id is not it"
        );
        assert_eq!(
            early(r#"{"id":7,"params":{"result":1"#),
            None,
            "a nested result is not it"
        );
        assert_eq!(early(r#"{"id":7,"method":"ping","result":{"x"#), None);
    }

    /// Padding after the id, and keys spelled with escapes, do not hide a response's id.
    #[test]
    fn padding_and_escaped_keys_do_not_hide_the_id() {
        let padded = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7{},\"result\":{{}}}}",
            " ".repeat(300)
        );
        assert_eq!(scan(&padded).response_id(), Some(json!(7)));
        assert_eq!(scan(&padded).early_response_id(), Some(json!(7)));
        let s = scan(r#"{"\u0069d" : "a b" ,"\u0072esult":{"x":1}}"#);
        assert_eq!(s.response_id(), Some(json!("a b")));
        assert!(s.has_outcome());
        assert_eq!(scan(r#"{"id":5,"id":5,"result":{}}"#).response_id(), None);
        assert_eq!(
            scan(r#"{"id":4,"result":{}}{"id":4,"result":{}}"#).response_id(),
            None
        );
        let s = scan(r#"{"id":1,"\u006d\u0065\u0074\u0068\u006f\u0064":"ping"}"#);
        assert!(s.has_method());
        assert_eq!(s.response_id(), None);
        // A key longer than any that matters is not decoded.
        assert!(!scan(&format!("{{\"{}\":1}}", "\\u0069".repeat(40))).has_outcome());
    }

    #[test]
    fn envelopes_rmcp_cannot_read_are_named() {
        let problem = |line: &str| match read_envelope(line.as_bytes(), &scan(line)) {
            Ok(_) => String::new(),
            Err(problem) => problem,
        };
        for (line, says) in [
            (r#"{"jsonrpc":"1.0","id":1,"result":{}}"#, "not \"2.0\""),
            (r#"{"id":1,"result":{}}"#, "missing field `jsonrpc`"),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":1,"result":{}}"#,
                "duplicate field `id`",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{}}{"jsonrpc":"2.0","id":1,"result":{}}"#,
                "trailing",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}"#,
                "invalid type",
            ),
            (r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#, "integer"),
            (
                r#"{"jsonrpc":"2.0","id":18446744073709551615,"result":{}}"#,
                "",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1}"#,
                "neither a result nor an error",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}"#,
                "both",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{},"error":null}"#,
                "error is null",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":null,"result":{}}"#,
                "a method beside",
            ),
            (r#"{"jsonrpc":"2.0","result":{}}"#, "no id"),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"t":"\ud83d"}}"#,
                "lone UTF-16 surrogate",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"\udc00":1}}"#,
                "lone UTF-16 surrogate",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"t":"\ud83d\u0041"}}"#,
                "lone UTF-16 surrogate",
            ),
            (
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\u{fffd}\"",
                "EOF",
            ),
        ] {
            let problem = problem(line);
            assert!(
                !problem.is_empty() && problem.contains(says),
                "{line}: {problem}"
            );
        }
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":3.0,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"x","\u0072esult":{"content":[]},"extra":1}"#,
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"m","data":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{"t":"\ud83d\ude00 \u00e9"}}"#,
        ] {
            assert_eq!(problem(line), "", "{line}");
        }
        let no_id =
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
        let envelope = read_envelope(no_id.as_bytes(), &scan(no_id)).unwrap();
        assert!(envelope.id.is_none());
        assert_eq!(envelope.error.as_deref(), Some("Parse error"));
        let not_utf8 = read_envelope(b"\xff", &Scanner::default()).err();
        assert!(not_utf8.unwrap_or_default().contains("UTF-8"));
    }

    #[test]
    fn requests_and_notifications_have_no_response_id() {
        assert_eq!(
            scan(r#"{"id":3,"method":"sampling/createMessage","params":{}}"#).response_id(),
            None
        );
        assert_eq!(
            scan(r#"{"method":"notifications/progress","params":{"id":1}}"#).response_id(),
            None
        );
        assert_eq!(scan(r#"{"id":{"x":1},"result":{}}"#).response_id(), None);
    }
}
