//! Progress from upstream servers, forwarded to whoever waits for the script that made the call.
//!
//! The codemode server registers a sink under the id of the `codemode` call it is running; a
//! script's MCP calls carry that id as their parent, so an upstream's `notifications/progress`
//! for one of them finds its way back to the client that asked. Both ends live in this crate,
//! which is why a process-wide table is enough and no other crate needs to know.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::ProgressToken;

/// Receives one line of progress text, such as `mcp__fs__search_files: 3/10 scanned src`.
pub type ProgressSink = Arc<dyn Fn(String) + Send + Sync>;

static ROUTES: LazyLock<Mutex<HashMap<String, ProgressSink>>> = LazyLock::new(Default::default);

/// Keeps a route open; dropping it closes the route.
pub struct ProgressRoute {
    key: String,
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        lock(&ROUTES).remove(&self.key);
    }
}

/// Sends upstream progress of every call whose parent call id is `call_id` to `sink`, until the
/// returned route is dropped.
pub fn route_progress(call_id: &str, sink: ProgressSink) -> ProgressRoute {
    lock(&ROUTES).insert(call_id.to_string(), sink);
    ProgressRoute {
        key: call_id.to_string(),
    }
}

pub(crate) fn sink_for(call_id: &str) -> Option<ProgressSink> {
    lock(&ROUTES).get(call_id).cloned()
}

/// The least time between two lines forwarded for one call: a server may send progress as
/// often as it likes, and every line goes on to the client (through a queue while it reads).
/// Each notification still resets the call's timeout; only the forwarding is thinned.
const MIN_GAP: Duration = Duration::from_millis(100);

/// The most bytes of a server's progress message forwarded; the rest is cut.
const MAX_MESSAGE: usize = 1000;

/// Where one call's progress goes, and when a line last went there.
struct Watcher {
    sink: ProgressSink,
    label: String,
    last: Option<Instant>,
}

/// One connection's requests that want their progress forwarded, by the token rmcp put on them.
#[derive(Clone, Default)]
pub(crate) struct Watchers(Arc<Mutex<HashMap<ProgressToken, Watcher>>>);

impl Watchers {
    pub(crate) fn watch(&self, token: ProgressToken, sink: ProgressSink, label: String) -> Watch {
        let watcher = Watcher {
            sink,
            label,
            last: None,
        };
        lock(&self.0).insert(token.clone(), watcher);
        Watch {
            watchers: self.clone(),
            token,
        }
    }

    pub(crate) fn deliver(
        &self,
        token: &ProgressToken,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) {
        let (sink, label) = {
            let mut watchers = lock(&self.0);
            let Some(watcher) = watchers.get_mut(token) else {
                return;
            };
            let now = Instant::now();
            if watcher.last.is_some_and(|last| now < last + MIN_GAP) {
                return;
            }
            watcher.last = Some(now);
            (watcher.sink.clone(), watcher.label.clone())
        };
        let amount = match total {
            Some(total) => format!("{progress}/{total}"),
            None => format!("{progress}"),
        };
        match message {
            Some(m) if !m.is_empty() => sink(format!("{label}: {} ({amount})", cut(m))),
            _ => sink(format!("{label}: {amount}")),
        }
    }
}

/// `message` within `MAX_MESSAGE` bytes, cut at a character boundary and marked when cut.
fn cut(message: &str) -> std::borrow::Cow<'_, str> {
    match head_within(message, MAX_MESSAGE) {
        None => message.into(),
        Some((head, rest)) => format!("{head}… ({rest} bytes cut)").into(),
    }
}

/// The longest head of `text` within `max` bytes that ends on a character boundary, and how
/// many bytes it leaves out; `None` when `text` fits.
pub(super) fn head_within(text: &str, max: usize) -> Option<(&str, usize)> {
    if text.len() <= max {
        return None;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some((&text[..end], text.len() - end))
}

/// Stops forwarding when dropped.
pub(crate) struct Watch {
    watchers: Watchers,
    token: ProgressToken,
}

impl Drop for Watch {
    fn drop(&mut self) {
        lock(&self.watchers.0).remove(&self.token);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
