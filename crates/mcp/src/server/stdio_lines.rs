//! The stdio transport of `codemode serve`: one JSON-RPC message per line, and an answer for
//! every line that is not one.
//!
//! rmcp's line transport drops a line that is not JSON (on purpose: rust-sdk issue 938) and a
//! line over its length limit, with a log line only, and answers JSON that is not a JSON-RPC
//! message with a bare "Invalid request". A client that sent such a line then waits for nothing.
//! Here the server reads the lines itself: a message goes to rmcp unchanged; a line that is not
//! JSON gets -32700, and one that is not a JSON-RPC request gets -32600 (with its `id` when one
//! can be read), each saying what was wrong and what a message looks like. Nothing is answered
//! for a notification or a response (JSON-RPC answers neither, and an echoing peer would
//! otherwise start an error storm), and blank lines are skipped. The connection stays up.

use std::io;
use std::sync::Arc;

use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

use crate::bounded_line::BoundedLine;

/// The longest line read (one message, newline included): rmcp's own limit.
pub(crate) const MAX_LINE: usize = DEFAULT_MAX_LINE_LENGTH;

/// Messages read ahead of rmcp; past this the reader stops reading (back-pressure).
const READ_AHEAD: usize = 16;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

/// What a well-formed request looks like, for the error messages.
const EXAMPLE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;

/// The output, shared by rmcp's responses and the reader's error answers so that lines never
/// interleave. `None` once closed.
type Output<W> = Arc<Mutex<Option<W>>>;

pub(crate) struct StdioLines<W> {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    out: Output<W>,
    reader: JoinHandle<()>,
}

impl<W: AsyncWrite + Unpin + Send + 'static> StdioLines<W> {
    pub(crate) fn new(read: impl AsyncRead + Unpin + Send + 'static, write: W) -> Self {
        Self::with_max_line(read, write, MAX_LINE)
    }

    fn with_max_line(read: impl AsyncRead + Unpin + Send + 'static, write: W, max: usize) -> Self {
        let out: Output<W> = Arc::new(Mutex::new(Some(write)));
        let (tx, incoming) = mpsc::channel(READ_AHEAD);
        let reader = tokio::spawn(read_lines(read, out.clone(), tx, max));
        StdioLines {
            incoming,
            out,
            reader,
        }
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> Transport<RoleServer> for StdioLines<W> {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let line = serde_json::to_vec(&item).map_err(io::Error::other);
        let out = self.out.clone();
        async move { write_line(&out, line?).await }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        self.incoming.close();
        let taken = self.out.lock().await.take();
        if let Some(mut w) = taken {
            w.shutdown().await?;
        }
        Ok(())
    }
}

impl<W> Drop for StdioLines<W> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn write_line<W: AsyncWrite + Unpin>(
    out: &Mutex<Option<W>>,
    mut line: Vec<u8>,
) -> io::Result<()> {
    line.push(b'\n');
    let mut out = out.lock().await;
    let Some(w) = out.as_mut() else {
        return Err(io::Error::new(
            io::ErrorKind::NotConnected,
            "the stdio transport is closed",
        ));
    };
    w.write_all(&line).await?;
    w.flush().await
}

/// Reads lines until end of input (a last line without a newline counts), or until rmcp stops
/// receiving or the output fails.
async fn read_lines<W: AsyncWrite + Unpin>(
    read: impl AsyncRead + Unpin,
    out: Output<W>,
    to: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    max_line: usize,
) {
    let mut read = BufReader::with_capacity(64 * 1024, read);
    let mut line = BoundedLine::new(max_line);
    loop {
        let (taken, ended, eof) = {
            let available = match read.fill_buf().await {
                Ok(available) => available,
                Err(e) => {
                    tracing::debug!(error = %e, "reading stdin failed");
                    return;
                }
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let piece = &available[..newline.map_or(available.len(), |i| i + 1)];
            line.push(piece);
            (piece.len(), newline.is_some(), available.is_empty())
        };
        read.consume(taken);
        if !ended && !eof {
            continue;
        }
        let verdict = if line.take_oversized() {
            Verdict::Answer(error_line(
                None,
                INVALID_REQUEST,
                format!(
                    "Invalid Request: the line is longer than {}, the most this server reads \
                     in one message, and was dropped unread; send smaller messages",
                    size(max_line)
                ),
            ))
        } else {
            judge(line.bytes())
        };
        line.clear();
        match verdict {
            Verdict::Message(m) => {
                if to.send(*m).await.is_err() {
                    return;
                }
            }
            Verdict::Answer(error) => {
                tracing::debug!(%error, "answered a stdin line that is not a JSON-RPC request");
                let bytes = serde_json::to_vec(&error).unwrap_or_default();
                if write_line(&out, bytes).await.is_err() {
                    return;
                }
            }
            Verdict::Skip => {}
        }
        if eof {
            return;
        }
    }
}

enum Verdict {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    Answer(Value),
    Skip,
}

/// What to do with one line (its newline included, if any).
fn judge(raw: &[u8]) -> Verdict {
    let line = raw.strip_suffix(b"\n").unwrap_or(raw);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // RFC 8259 lets a parser ignore a UTF-8 byte order mark, and rmcp does.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Skip;
    }
    let parsed = serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line);
    let e = match parsed {
        Ok(m) => return Verdict::Message(Box::new(m)),
        Err(e) => e,
    };
    let value = match serde_json::from_slice::<Value>(line) {
        Ok(v) => v,
        Err(e) => {
            return Verdict::Answer(error_line(
                None,
                PARSE_ERROR,
                format!(
                    "Parse error: the line is not JSON ({e}). Send each JSON-RPC 2.0 message as \
                     one line of UTF-8 JSON, such as {EXAMPLE}"
                ),
            ));
        }
    };
    let Some(object) = value.as_object() else {
        let what = match &value {
            Value::Array(_) => "a JSON array (a batch, which MCP does not use)".to_string(),
            other => format!("a JSON {}", kind(other)),
        };
        return Verdict::Answer(error_line(
            None,
            INVALID_REQUEST,
            format!(
                "Invalid Request: a JSON-RPC message is a JSON object, and this line is {what}. \
                 Send one object per line, such as {EXAMPLE}"
            ),
        ));
    };
    let method = object.get("method");
    // JSON-RPC answers neither a response nor a notification, even a broken one; rmcp also
    // ignores notifications it does not know (other protocols' messages on the same pipe).
    if method.is_none() && (object.contains_key("result") || object.contains_key("error")) {
        tracing::debug!(error = %e, "ignored a response on stdin that cannot be read");
        return Verdict::Skip;
    }
    if method.is_some_and(Value::is_string) && !object.contains_key("id") {
        tracing::debug!(error = %e, "ignored a notification on stdin that cannot be read");
        return Verdict::Skip;
    }
    let id = object
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned();
    Verdict::Answer(error_line(
        id,
        INVALID_REQUEST,
        format!(
            "Invalid Request: {}. A request looks like {EXAMPLE}",
            what_is_wrong(object, &e)
        ),
    ))
}

/// The first thing wrong with an object that is not a JSON-RPC 2.0 request.
fn what_is_wrong(object: &serde_json::Map<String, Value>, e: &serde_json::Error) -> String {
    match object.get("jsonrpc") {
        None => return "it has no \"jsonrpc\": \"2.0\"".into(),
        Some(v) if v != "2.0" => return format!("\"jsonrpc\" is {v}; it must be \"2.0\""),
        Some(_) => {}
    }
    match object.get("method") {
        None => {
            return "it has no \"method\" (a request) and no \"result\" or \"error\" (a response)"
                .into();
        }
        Some(m) if !m.is_string() => {
            return format!("\"method\" is a {}; it must be a string", kind(m));
        }
        Some(_) => {}
    }
    if object.contains_key("result") || object.contains_key("error") {
        return "it has a \"method\" and a \"result\" or \"error\": a message is either a request or a response".into();
    }
    if let Some(id) = object.get("id")
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return format!("\"id\" is {}; it must be a string or an integer", kind(id));
    }
    if let Some(p) = object.get("params")
        && !p.is_object()
    {
        return format!("\"params\" is {}; it must be an object", kind(p));
    }
    format!("it is not a JSON-RPC 2.0 request this server can read ({e})")
}

fn size(bytes: usize) -> String {
    match bytes.is_multiple_of(1024 * 1024) {
        true => format!("{} MiB", bytes / (1024 * 1024)),
        false => format!("{bytes} bytes"),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A JSON-RPC error response; `id` is null when it could not be read (JSON-RPC 2.0 §5).
fn error_line(id: Option<Value>, code: i64, message: String) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": { "code": code, "message": message },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Feeds `input` to the transport; returns what it wrote and the methods it passed on.
    async fn run(input: Vec<u8>, max_line: usize) -> (Vec<Value>, Vec<String>) {
        let (mut out, write) = tokio::io::duplex(1 << 20);
        let mut t = StdioLines::with_max_line(std::io::Cursor::new(input), write, max_line);
        let mut methods = Vec::new();
        while let Some(m) = t.receive().await {
            let v = serde_json::to_value(&m).unwrap();
            methods.push(v["method"].as_str().unwrap_or("").to_string());
        }
        t.close().await.unwrap();
        let mut text = String::new();
        out.read_to_string(&mut text).await.unwrap();
        let answers = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (answers, methods)
    }

    fn code_and_message(v: &Value) -> (i64, &str) {
        (
            v["error"]["code"].as_i64().unwrap(),
            v["error"]["message"].as_str().unwrap(),
        )
    }

    #[tokio::test]
    async fn every_line_that_is_not_a_request_is_answered_and_messages_pass() {
        let input = concat!(
            "hello\n",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"meth\n",
            "[1,2]\n",
            "42\n",
            "{\"jsonrpc\":\"1.0\",\"id\":7,\"method\":\"ping\"}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":5}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"ping\"}\n",
            "{\"foo\":1}\n",
            "\n",
            "   \r\n",
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\r\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/whatever\",\"params\":7}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"error\":\"x\"}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}",
        );
        let (answers, methods) = run(input.as_bytes().to_vec(), MAX_LINE).await;
        assert_eq!(methods, ["ping", "ping"]);
        assert_eq!(answers.len(), 8, "{answers:#?}");
        for a in &answers {
            assert_eq!(a["jsonrpc"], "2.0");
        }
        let expect = [
            (Value::Null, PARSE_ERROR, "not JSON (expected value"),
            (Value::Null, PARSE_ERROR, "EOF while parsing"),
            (Value::Null, INVALID_REQUEST, "a batch"),
            (Value::Null, INVALID_REQUEST, "a JSON number"),
            (json!(7), INVALID_REQUEST, "\"jsonrpc\" is \"1.0\""),
            (json!("a"), INVALID_REQUEST, "\"method\" is a number"),
            (Value::Null, INVALID_REQUEST, "\"id\" is array"),
            (Value::Null, INVALID_REQUEST, "no \"jsonrpc\""),
        ];
        for (a, (id, code, says)) in answers.iter().zip(expect) {
            assert_eq!(a["id"], id, "{a}");
            let (c, m) = code_and_message(a);
            assert_eq!(c, code, "{a}");
            assert!(m.contains(says), "{m:?} does not say {says:?}");
        }
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_answered_and_the_next_one_read() {
        let long = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"_meta\":{{\"p\":\"{}\"}}}}}}\n",
            "x".repeat(300)
        );
        let input = format!("{long}{}\n", r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
        let (answers, methods) = run(input.into_bytes(), 200).await;
        assert_eq!(methods, ["ping"]);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0]["id"], Value::Null);
        let (code, message) = code_and_message(&answers[0]);
        assert_eq!(code, INVALID_REQUEST);
        assert!(message.contains("longer than"), "{message}");
    }
}
