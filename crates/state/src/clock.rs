//! Time as the store sees it: Unix milliseconds from a clock the embedder can replace.
//!
//! Expiry (approvals, budget reservations) and cell leases compare against this clock. Replicas
//! sharing one database therefore need clocks that agree (NTP); tests use [`Clock::manual`] to
//! move time without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat, Utc};

/// Where "now" comes from.
#[derive(Clone)]
pub struct Clock(Source);

#[derive(Clone)]
enum Source {
    System,
    Manual(Arc<AtomicI64>),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::System => f.write_str("Clock::system"),
            Source::Manual(t) => write!(f, "Clock::manual({})", t.load(Ordering::SeqCst)),
        }
    }
}

impl Clock {
    /// The machine's wall clock.
    pub fn system() -> Self {
        Clock(Source::System)
    }

    /// A clock that only moves when told to, starting at `start_ms`.
    pub fn manual(start_ms: i64) -> (Self, ManualClock) {
        let t = Arc::new(AtomicI64::new(start_ms));
        (Clock(Source::Manual(t.clone())), ManualClock(t))
    }

    /// Unix milliseconds now.
    pub fn now_ms(&self) -> i64 {
        match &self.0 {
            Source::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            Source::Manual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// `now + d`, saturating.
    pub fn after(&self, d: Duration) -> i64 {
        self.now_ms()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The handle that moves a [`Clock::manual`] clock.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

/// A Unix millisecond time as RFC 3339 (UTC), for messages people read.
pub fn format_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms after 1970"))
}

/// The UTC day (`YYYY-MM-DD`) a Unix millisecond time falls on, for per-day budget ledgers.
pub fn utc_day(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "1970-01-01".to_string())
}
