//! The transport to a stdio server: rmcp's line transport, reading the server's stdout through a
//! screen that turns a response rmcp would drop into an error for the request it answers.
//!
//! rmcp discards a line over its length limit, and a line serde_json refuses to parse (too
//! deeply nested), with a log line only; the call then waits until its timeout and fails as
//! "timed out". The screen sits between the server's stdout and rmcp: lines within both limits
//! pass unchanged, and a response over either is replaced by a JSON-RPC error for the same id
//! that says what was wrong. The connection stays usable: the next line is read as usual.

use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::process::{ChildStderr, ChildStdin};

use super::backlog::Backlog;
use super::screen::{MAX_DEPTH, Scanner};
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
    inner: AsyncRwTransport<RoleClient, DuplexStream, ChildStdin>,
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
        let (read, write) = tokio::io::duplex(64 * 1024);
        tokio::spawn(screen_lines(
            server.clone(),
            stdout,
            write,
            MAX_LINE,
            exited,
        ));
        let transport = ChildTransport {
            server,
            child: Some(child),
            inner: AsyncRwTransport::new_client(read, stdin),
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
        let receive = self.inner.receive();
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
    mut to: impl AsyncWrite + Unpin,
    max_line: usize,
    exited: impl Future<Output = ()>,
) {
    let mut from = BufReader::with_capacity(64 * 1024, from);
    let mut line = BoundedLine::new(max_line);
    let mut scanner = Scanner::default();
    let mut exited = std::pin::pin!(exited);
    let mut gone = false;
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
            continue;
        }
        let scanned = std::mem::take(&mut scanner);
        let pass = if line.take_oversized() {
            rejected(
                &server,
                &scanned,
                &format!(
                    "the server's response was larger than {}, the most codemode reads in one \
                     message, and was dropped; ask the tool for less (a smaller page, range or \
                     limit)",
                    mib(max_line)
                ),
            )
        } else if scanned.deepest() > MAX_DEPTH {
            rejected(
                &server,
                &scanned,
                &format!(
                    "the server's response nests JSON {} levels deep, more than the {MAX_DEPTH} \
                     levels codemode reads (the JSON-RPC envelope included), and was dropped",
                    scanned.deepest()
                ),
            )
        } else if let Some(why) = unreadable_response(&scanned, line.bytes()) {
            rejected(&server, &scanned, &why)
        } else {
            Some(line.take_bytes())
        };
        line.clear();
        if let Some(bytes) = pass
            && to.write_all(&bytes).await.is_err()
        {
            break;
        }
    }
}

/// Why rmcp would drop a response line it cannot read (cut-off JSON, neither `result` nor
/// `error`, another JSON-RPC version), if it would. Only responses are read twice: they are the
/// lines a call waits for.
fn unreadable_response(scanned: &Scanner, line: &[u8]) -> Option<String> {
    scanned.response_id()?;
    let e = serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(line).err()?;
    Some(format!(
        "the server's answer is not a JSON-RPC response codemode can read ({e}), and was dropped; the fault is the server's, not the call's"
    ))
}

/// The error line that replaces a rejected response, when it answered a request.
fn rejected(server: &str, scanned: &Scanner, why: &str) -> Option<Vec<u8>> {
    let Some(id) = scanned.response_id() else {
        tracing::warn!(%server, "MCP server message dropped: {why} (it answered no request)");
        return None;
    };
    tracing::warn!(%server, %id, "MCP server response refused: {why}");
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32603, "message": why },
    });
    let mut bytes = serde_json::to_vec(&error).ok()?;
    bytes.push(b'\n');
    Some(bytes)
}

fn mib(bytes: usize) -> String {
    if bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use tokio::io::AsyncReadExt;

    async fn screened(input: Vec<u8>, max_line: usize) -> Vec<Value> {
        let (mut out, into) = tokio::io::duplex(1024);
        let task = tokio::spawn(screen_lines(
            "t".into(),
            std::io::Cursor::new(input),
            into,
            max_line,
            std::future::pending(),
        ));
        let mut text = String::new();
        out.read_to_string(&mut text).await.unwrap();
        task.await.unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
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

    #[tokio::test]
    async fn an_oversized_notification_is_dropped_without_inventing_a_response() {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"data": "x".repeat(5000)}, "id": 1});
        let out = screened(format!("{note}\n").into_bytes(), 1000).await;
        assert!(out.is_empty());
    }
}
