//! The transport to a stdio server: the server's stdout is read by a screen that parses each
//! message once and hands it to rmcp, and turns a response rmcp could not read into an error for
//! the request it answers; what codemode sends goes through rmcp's line transport.
//!
//! rmcp's own reader discards a line over its length limit, and a line serde_json refuses to
//! parse (too deeply nested), with a log line only; the call then waits until its timeout and
//! fails as "timed out". The screen refuses a response over a limit (length, nesting, values)
//! before parsing it and answers its request with a JSON-RPC error that says what was wrong. It
//! parses what passes exactly once (rmcp's message type is an untagged enum, costly on a large
//! answer) and passes messages one at a time: while rmcp has not taken one, the next line is not
//! read, so answers waiting between the server and a call hold at most one message. The
//! connection stays usable: the next line is read as usual.

use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Empty};
use tokio::process::{ChildStderr, ChildStdin};
use tokio::sync::mpsc;

use super::backlog::Backlog;
use super::screen::{Scanner, refusal, rejected, unreadable};
use crate::bounded_line::BoundedLine;

/// The longest line (one JSON-RPC message, newline included) read from a server: rmcp's own
/// limit, so that everything the screen passes rmcp also reads.
pub(crate) const MAX_LINE: usize = DEFAULT_MAX_LINE_LENGTH;

/// How long the screen keeps reading after the server exited, while output still arrives: the
/// server's last lines may still be in the pipe, though something it started keeps it open.
const DRAIN_QUIET: Duration = Duration::from_millis(200);

/// How long `close` waits for the server to exit after its stdin closed, and again after SIGTERM.
const EXIT_WAIT: Duration = Duration::from_secs(3);

pub(crate) struct ChildTransport {
    server: Arc<str>,
    child: Option<Box<dyn ChildWrapper>>,
    /// Writes to the server's stdin (its reading half is never used).
    inner: AsyncRwTransport<RoleClient, Empty, ChildStdin>,
    /// The server's messages, parsed by the screen.
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    /// What waits to be written to the server's stdin: a server that stops reading is closed.
    backlog: Arc<Backlog>,
}

impl ChildTransport {
    /// Starts the server with piped stdio; its stderr is returned to be read by the caller.
    pub(crate) fn spawn(
        mut command: CommandWrap,
        server: Arc<str>,
    ) -> io::Result<(Self, Option<ChildStderr>)> {
        command
            .command_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        let stdin = child
            .stdin()
            .take()
            .ok_or_else(|| io::Error::other("the server's stdin was not piped"))?;
        let stdout = child
            .stdout()
            .take()
            .ok_or_else(|| io::Error::other("the server's stdout was not piped"))?;
        let stderr = child.stderr().take();
        let exited: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
            match child.id().and_then(super::exited::exit_of) {
                Some(exit) => Box::pin(exit),
                None => Box::pin(std::future::pending()),
            };
        let (to_rmcp, incoming) = mpsc::channel(1);
        tokio::spawn(screen_lines(
            server.clone(),
            stdout,
            to_rmcp,
            MAX_LINE,
            exited,
        ));
        let transport = ChildTransport {
            server,
            child: Some(child),
            inner: AsyncRwTransport::new_client(tokio::io::empty(), stdin),
            incoming,
            backlog: Arc::default(),
        };
        Ok((transport, stderr))
    }

    pub(crate) fn id(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// What waits to be written to the server, for telling why the connection closed.
    pub(crate) fn backlog(&self) -> Arc<Backlog> {
        self.backlog.clone()
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Measured as written: the message's JSON and its newline.
        let bytes = serde_json::to_vec(&item).map_or(0, |json| json.len() + 1);
        let send = match self.backlog.queue(&self.server, bytes) {
            Some(queued) => Ok((queued, self.inner.send(item))),
            None => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the MCP server stopped reading what codemode sends it",
            )),
        };
        async move {
            let (_queued, send) = send?;
            send.await
        }
    }

    /// Ends (rmcp then closes the connection) once the server was found to read nothing.
    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        let backlog = self.backlog.clone();
        let receive = self.incoming.recv();
        async move {
            tokio::select! {
                biased;
                () = backlog.stalled() => None,
                message = receive => message,
            }
        }
    }

    /// The MCP stdio shutdown: close the server's stdin, wait, SIGTERM, wait, kill. A server that
    /// stopped reading is killed first: a write blocked on its full stdin holds the writer,
    /// which closing its stdin waits for.
    async fn close(&mut self) -> Result<(), Self::Error> {
        if self.backlog.is_stalled()
            && let Some(child) = self.child.as_mut()
        {
            let _ = child.start_kill();
        }
        self.inner.close().await?;
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Ok(status) = tokio::time::timeout(EXIT_WAIT, child.wait()).await {
            self.child = None;
            return status.map(drop);
        }
        if child.signal(libc::SIGTERM).is_ok()
            && let Ok(status) = tokio::time::timeout(EXIT_WAIT, child.wait()).await
        {
            self.child = None;
            return status.map(drop);
        }
        let killed = Box::into_pin(child.kill()).await;
        self.child = None;
        killed
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// Copies the server's lines to rmcp, replacing each response over a limit with an error for
/// its request. Ends at the server's end of output, shortly after `exited` resolves (the server
/// exited, though something it started may hold its output open), or when rmcp stops reading.
/// Ending is how rmcp learns the connection is closed.
async fn screen_lines(
    server: Arc<str>,
    from: impl AsyncRead + Unpin,
    to: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
    max_line: usize,
    exited: impl Future<Output = ()>,
) {
    let mut from = BufReader::with_capacity(64 * 1024, from);
    let mut line = BoundedLine::new(max_line);
    let mut scanner = Scanner::default();
    let mut exited = std::pin::pin!(exited);
    let mut gone = false;
    // The line's response was already refused, before its end.
    let mut answered = false;
    loop {
        let (taken, ended) = {
            let read = if gone {
                match tokio::time::timeout(DRAIN_QUIET, from.fill_buf()).await {
                    Ok(read) => read,
                    Err(_) => {
                        tracing::debug!(%server, "the MCP server exited; something it started still holds its stdout");
                        break;
                    }
                }
            } else {
                tokio::select! {
                    read = from.fill_buf() => read,
                    () = &mut exited => {
                        gone = true;
                        continue;
                    }
                }
            };
            let available = match read {
                Ok(available) => available,
                Err(e) => {
                    tracing::debug!(%server, error = %e, "reading the MCP server's stdout failed");
                    break;
                }
            };
            if available.is_empty() {
                break;
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let piece = &available[..newline.map_or(available.len(), |i| i + 1)];
            scanner.feed(piece);
            line.push(piece);
            (piece.len(), newline.is_some())
        };
        from.consume(taken);
        if !ended {
            // A response past a bound is refused as soon as its id is known: its newline may
            // come much later, or never, and its call would wait for its timeout.
            if !answered
                && let Some(why) = refusal(&scanner, line.is_oversized(), max_line)
                && let Some(id) = scanner.early_response_id()
            {
                answered = true;
                if let Some(message) = rejected(&server, Some(id), &why)
                    && to.send(message).await.is_err()
                {
                    break;
                }
            }
            continue;
        }
        let scanned = std::mem::take(&mut scanner);
        let oversized = line.take_oversized();
        let pass = if std::mem::take(&mut answered) {
            None
        } else if let Some(why) = refusal(&scanned, oversized, max_line) {
            rejected(&server, scanned.response_id(), &why)
        } else {
            parsed(&server, &scanned, line.bytes())
        };
        line.clear();
        if let Some(message) = pass
            && to.send(message).await.is_err()
        {
            break;
        }
    }
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The line as a message. A response that cannot be read (cut-off JSON, neither `result` nor
/// `error`, another JSON-RPC version) becomes an error for its request, which would otherwise
/// wait for its timeout; any other such line is dropped (at debug level: a server could send
/// many).
fn parsed(server: &str, scanned: &Scanner, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    match serde_json::from_slice(line) {
        Ok(message) => Some(message),
        Err(e) if scanned.response_id().is_some() => {
            rejected(server, scanned.response_id(), &unreadable(e))
        }
        Err(e) => {
            tracing::debug!(%server, error = %e, "an MCP server message codemode cannot read was dropped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::screen::MAX_VALUES;
    use super::*;
    use serde_json::{Value, json};

    /// What the screen hands rmcp, as JSON.
    async fn screened(input: Vec<u8>, max_line: usize) -> Vec<Value> {
        let (into, mut out) = mpsc::channel(1);
        let task = tokio::spawn(screen_lines(
            "t".into(),
            std::io::Cursor::new(input),
            into,
            max_line,
            std::future::pending(),
        ));
        let mut messages = Vec::new();
        while let Some(message) = out.recv().await {
            messages.push(serde_json::to_value(&message).unwrap());
        }
        task.await.unwrap();
        messages
    }

    /// A line is read only once rmcp took the one before: answers do not pile up between the
    /// server and rmcp, the server's writes wait instead.
    #[tokio::test]
    async fn the_server_waits_while_rmcp_has_not_taken_the_last_message() {
        use tokio::io::AsyncWriteExt;
        let (mut server, stdout) = tokio::io::duplex(64 * 1024);
        let (into, mut out) = mpsc::channel(1);
        tokio::spawn(screen_lines(
            "t".into(),
            stdout,
            into,
            MAX_LINE,
            std::future::pending(),
        ));
        let lines = 8;
        let writer = tokio::spawn(async move {
            for id in 1..=lines {
                let line =
                    json!({"jsonrpc": "2.0", "id": id, "result": {"t": "x".repeat(100_000)}});
                server
                    .write_all(format!("{line}\n").as_bytes())
                    .await
                    .unwrap();
            }
            server
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !writer.is_finished(),
            "800 KB were taken in while rmcp took nothing"
        );
        for id in 1..=lines {
            let next = out.recv().await.unwrap();
            assert_eq!(serde_json::to_value(&next).unwrap()["id"], id);
        }
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_byte_order_mark_is_read_past_and_an_unreadable_answer_fails_its_call() {
        let input = "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\
                     {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"a\":}\n\
                     {\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":[}\n";
        let out = screened(input.as_bytes().to_vec(), MAX_LINE).await;
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0]["id"], 1);
        assert_eq!(out[1]["id"], 2);
        let message = out[1]["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("not a JSON-RPC response codemode can read"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_oversized_response_becomes_an_error_and_the_next_line_passes() {
        let big = json!({"jsonrpc": "2.0", "result": {"t": "x".repeat(5000)}, "id": 4});
        let small = json!({"jsonrpc": "2.0", "id": 5, "result": {}});
        let input = format!("{big}\n{small}\n").into_bytes();
        let out = screened(input, 1000).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["id"], 4);
        let message = out[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("larger than 1000 bytes"), "{message}");
        assert_eq!(out[1], small);
    }

    #[tokio::test]
    async fn a_too_deep_response_becomes_an_error() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let input = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{{\"v\":{deep}}}}}\n");
        let out = screened(input.into_bytes(), MAX_LINE).await;
        let message = out[0]["error"]["message"].as_str().unwrap();
        assert_eq!(out[0]["id"], "a");
        assert!(message.contains("202 levels deep"), "{message}");
        assert!(message.contains("127"), "{message}");
    }

    /// Small in bytes, costly to parse: refused unparsed, and the connection goes on.
    #[tokio::test]
    async fn a_response_of_too_many_values_becomes_an_error() {
        let zeros = vec![0u8; MAX_VALUES];
        let wide =
            json!({"jsonrpc": "2.0", "id": 7, "result": {"structuredContent": {"v": zeros}}});
        let just = json!({"jsonrpc": "2.0", "id": 8, "result": {"v": vec![0u8; MAX_VALUES - 9]}});
        let input = format!("{wide}\n{just}\n").into_bytes();
        let out = screened(input, MAX_LINE).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["id"], 7);
        let message = out[0]["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("more than 1048576 JSON values"),
            "{message}"
        );
        assert!(message.contains("ask the tool for less"), "{message}");
        assert_eq!(out[1], just, "a line of exactly the limit passes");
    }

    #[tokio::test]
    async fn an_oversized_notification_is_dropped_without_inventing_a_response() {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"data": "x".repeat(5000)}, "id": 1});
        let out = screened(format!("{note}\n").into_bytes(), 1000).await;
        assert!(out.is_empty());
    }
}
