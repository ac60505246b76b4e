//! A server's own log messages (`notifications/message`) in the host's log, bounded: each is
//! cut to `MAX_DATA` bytes, and at most `MAX_PER_SECOND` of one server's are written a second.
//! A server may send them as fast and as large as its output allows; the host's log (and the
//! disk under it) should not grow with it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most bytes of one message's data written to the log; the rest is cut, and the line says
/// how much.
pub(crate) const MAX_DATA: usize = 4096;

/// The most messages of one server written in one second; the rest are counted, and the first
/// line written after them says how many were dropped.
pub(crate) const MAX_PER_SECOND: u32 = 20;

const WINDOW: Duration = Duration::from_secs(1);

struct Window {
    started: Instant,
    written: u32,
    dropped: u64,
}

/// One server's log limit.
pub(crate) struct LogLimit(Mutex<Window>);

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit(Mutex::new(Window {
            started: Instant::now(),
            written: 0,
            dropped: 0,
        }))
    }
}

/// What to do with one message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write it; `dropped` messages before it were not written.
    Write {
        dropped: u64,
    },
    Drop,
}

impl LogLimit {
    pub(crate) fn admit(&self, now: Instant) -> Admit {
        let mut window = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(window.started) >= WINDOW {
            window.started = now;
            window.written = 0;
        }
        if window.written >= MAX_PER_SECOND {
            window.dropped = window.dropped.saturating_add(1);
            return Admit::Drop;
        }
        window.written += 1;
        Admit::Write {
            dropped: std::mem::take(&mut window.dropped),
        }
    }
}

/// `data` as written to the log: its JSON, cut to `MAX_DATA` bytes at a character boundary,
/// with a note of how much was cut.
pub(crate) fn shown(data: &serde_json::Value) -> String {
    cut(data.to_string())
}

fn cut(text: String) -> String {
    if text.len() <= MAX_DATA {
        return text;
    }
    let mut end = MAX_DATA;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_rate_the_rest_is_dropped_and_counted_for_the_next_window() {
        let limit = LogLimit::default();
        let start = Instant::now();
        for _ in 0..MAX_PER_SECOND {
            assert_eq!(limit.admit(start), Admit::Write { dropped: 0 });
        }
        assert_eq!(limit.admit(start), Admit::Drop);
        assert_eq!(limit.admit(start), Admit::Drop);
        assert_eq!(limit.admit(start + WINDOW), Admit::Write { dropped: 2 });
    }

    #[test]
    fn long_data_is_cut_at_a_character_and_says_how_much() {
        let data = serde_json::Value::String("é".repeat(MAX_DATA));
        let text = shown(&data);
        assert!(text.len() < MAX_DATA + 100, "{}", text.len());
        // 8,194 bytes of JSON (quotes included), cut at the last character that ends by 4,096.
        assert!(text.starts_with("\"é"), "{text}");
        assert!(text.ends_with("… (4099 bytes cut)"), "{text}");
        assert_eq!(shown(&serde_json::json!({"a": 1})), r#"{"a":1}"#);
    }
}
