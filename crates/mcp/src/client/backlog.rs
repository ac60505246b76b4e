//! What codemode has given a stdio server to read and the server has not read yet.
//!
//! rmcp answers every request a server sends (a `ping`, say) and keeps each answer until it
//! can be written to the server's stdin, without a limit. A server that sends requests and
//! never reads would make the host hold every answer. The backlog counts what waits; past
//! either limit the server is taken to have stopped reading: nothing more is queued for it
//! and its connection is closed (the next call starts it again).

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// The most messages waiting to be written to one server.
pub(crate) const MAX_MESSAGES: usize = 1024;

/// The most bytes waiting to be written to one server. One message larger than this still goes
/// out when nothing else waits.
pub(crate) const MAX_BYTES: usize = 32 * 1024 * 1024;

#[derive(Default)]
struct Waiting {
    messages: usize,
    bytes: usize,
}

/// One connection's unwritten messages, and whether it was given up on.
#[derive(Default)]
pub(crate) struct Backlog {
    waiting: Mutex<Waiting>,
    stalled: CancellationToken,
}

/// One message counted in the backlog until it is written (or dropped).
pub(crate) struct Queued {
    backlog: Arc<Backlog>,
    bytes: usize,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut waiting = lock(&self.backlog.waiting);
        waiting.messages = waiting.messages.saturating_sub(1);
        waiting.bytes = waiting.bytes.saturating_sub(self.bytes);
    }
}

impl Backlog {
    /// Counts a message of `bytes` as waiting, or refuses it (and marks the connection
    /// stalled) when the server has left too much unread.
    pub(crate) fn queue(self: &Arc<Self>, server: &str, bytes: usize) -> Option<Queued> {
        if self.is_stalled() {
            return None;
        }
        let mut waiting = lock(&self.waiting);
        let too_many = waiting.messages >= MAX_MESSAGES;
        let too_large = waiting.messages > 0 && waiting.bytes.saturating_add(bytes) > MAX_BYTES;
        if too_many || too_large {
            tracing::warn!(
                %server,
                messages = waiting.messages,
                bytes = waiting.bytes,
                "the MCP server stopped reading what codemode sends it; closing it (the next call \
                 starts it again)"
            );
            self.stalled.cancel();
            return None;
        }
        waiting.messages += 1;
        waiting.bytes = waiting.bytes.saturating_add(bytes);
        Some(Queued {
            backlog: self.clone(),
            bytes,
        })
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.is_cancelled()
    }

    /// Resolves once the connection was given up on.
    pub(crate) async fn stalled(&self) {
        self.stalled.cancelled().await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_past_its_count_stalls_and_refuses_everything_after() {
        let backlog = Arc::new(Backlog::default());
        let queued: Vec<_> = (0..MAX_MESSAGES)
            .map(|_| backlog.queue("s", 10).expect("within the limit"))
            .collect();
        assert!(backlog.queue("s", 10).is_none());
        assert!(backlog.is_stalled());
        drop(queued);
        assert!(
            backlog.queue("s", 10).is_none(),
            "a stalled server stays given up on"
        );
    }

    #[test]
    fn one_large_message_goes_out_alone_but_not_behind_others() {
        let backlog = Arc::new(Backlog::default());
        let big = backlog.queue("s", MAX_BYTES * 2).expect("alone, it may go");
        drop(big);
        let small = backlog.queue("s", 10).expect("the backlog emptied");
        assert!(backlog.queue("s", MAX_BYTES).is_none());
        drop(small);
    }
}
