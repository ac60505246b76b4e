//! A script's deadline clock, which stands still while a person decides.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Measures how long a script has been running, less the time spent waiting on a person.
///
/// The sandbox owns one per script and checks its deadline against [`DeadlineClock::running`];
/// the gate holds a [`PauseGuard`] while an approval is pending, so that a script's deadline does
/// not run out while somebody is reading the question. Cloning shares the clock.
#[derive(Debug, Clone)]
pub struct DeadlineClock {
    inner: Arc<Mutex<ClockState>>,
}

#[derive(Debug)]
struct ClockState {
    started: Instant,
    paused_total: Duration,
    pauses_held: usize,
    paused_since: Option<Instant>,
}

impl Default for DeadlineClock {
    fn default() -> Self {
        Self::new()
    }
}

impl DeadlineClock {
    pub fn new() -> Self {
        DeadlineClock {
            inner: Arc::new(Mutex::new(ClockState {
                started: Instant::now(),
                paused_total: Duration::ZERO,
                pauses_held: 0,
                paused_since: None,
            })),
        }
    }

    /// Stops the clock until the returned guard is dropped. Pauses nest.
    pub fn pause(&self) -> PauseGuard {
        let mut s = lock(&self.inner);
        if s.pauses_held == 0 {
            s.paused_since = Some(Instant::now());
        }
        s.pauses_held += 1;
        PauseGuard {
            inner: self.inner.clone(),
        }
    }

    /// True while at least one pause is held.
    pub fn is_paused(&self) -> bool {
        lock(&self.inner).pauses_held > 0
    }

    /// Time counted against the deadline: wall time since start, less paused time.
    pub fn running(&self) -> Duration {
        let s = lock(&self.inner);
        let now = Instant::now();
        let paused_now = s.paused_since.map(|p| now - p).unwrap_or_default();
        (now - s.started).saturating_sub(s.paused_total + paused_now)
    }

    /// Total time spent paused so far.
    pub fn paused(&self) -> Duration {
        let s = lock(&self.inner);
        s.paused_total + s.paused_since.map(|p| p.elapsed()).unwrap_or_default()
    }
}

/// Keeps a [`DeadlineClock`] stopped while alive.
#[derive(Debug)]
pub struct PauseGuard {
    inner: Arc<Mutex<ClockState>>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.inner);
        s.pauses_held = s.pauses_held.saturating_sub(1);
        if s.pauses_held == 0
            && let Some(since) = s.paused_since.take()
        {
            s.paused_total += since.elapsed();
        }
    }
}

// A poisoned clock only means a panic elsewhere; the numbers are still usable.
fn lock(m: &Mutex<ClockState>) -> std::sync::MutexGuard<'_, ClockState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_time_does_not_count() {
        let clock = DeadlineClock::new();
        {
            let _a = clock.pause();
            let _b = clock.pause();
            std::thread::sleep(Duration::from_millis(60));
            assert!(clock.is_paused());
        }
        assert!(!clock.is_paused());
        assert!(
            clock.running() < Duration::from_millis(40),
            "{:?}",
            clock.running()
        );
        assert!(clock.paused() >= Duration::from_millis(60));
    }
}
