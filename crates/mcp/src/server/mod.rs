//! The server side: codemode as an MCP server any MCP client can add.

mod approval;
mod handler;
mod http;
mod peer_uid;
mod result;
mod sessions;
mod stdio_lines;
mod transport;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use approval::ElicitationApprover;
pub use http::{
    DEFAULT_MAX_CONNECTIONS_PER_PEER, HttpOptions, HttpServer, MetricsText, TokenPrincipal,
    serve_http,
};
pub use transport::serve_stdio;

use crate::McpHub;

/// What every transport's sessions share.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// The upstream servers: their state goes into the `codemode` description, and in mode `on`
    /// their resources and prompts are offered to the client.
    pub hub: Option<Arc<McpHub>>,
    /// Cancelled when codemode shuts down: running scripts are aborted (their calls cancelled
    /// upstream, their audit lines written) and no new session starts.
    pub shutdown: CancellationToken,
    /// Counts the tool calls being served, so a shutdown can wait for them to end.
    pub activity: Activity,
}

/// How many tool calls are being served right now.
#[derive(Clone, Default)]
pub struct Activity(Arc<ActivityInner>);

#[derive(Default)]
struct ActivityInner {
    running: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Activity {
    pub(crate) fn enter(&self) -> Busy {
        self.0.running.fetch_add(1, Ordering::AcqRel);
        Busy(self.0.clone())
    }

    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::Acquire)
    }

    /// Waits until no call is being served, or `limit` passed; true when idle.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.0.idle.notified();
                if self.running() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

pub(crate) struct Busy(Arc<ActivityInner>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
