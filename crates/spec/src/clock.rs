//! A script's deadline clock, which stands still while a person decides.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Measures how long a script has been running, less the time spent waiting on a person.
///
/// The sandbox owns one per script and checks its deadline against [`DeadlineClock::running`];
/// the gate holds a [`PauseGuard`] while an approval is pending, so that a script's deadline does
/// not run out while somebody is reading the question. The clock stands still only while every
/// call the script has in flight waits for a person ([`DeadlineClock::call_active`] counts
/// them): a script that leaves a question pending and goes on calling other tools is not
/// waiting on anyone, and its time counts. Cloning shares the clock.
#[derive(Debug, Clone)]
pub struct DeadlineClock {
    inner: Arc<Mutex<ClockState>>,
}

#[derive(Debug)]
struct ClockState {
    started: Instant,
    paused_total: Duration,
    pauses_held: usize,
    /// The script's calls in flight, as the sandbox counts them.
    active_calls: usize,
    paused_since: Option<Instant>,
}

impl ClockState {
    /// Starts or ends the current pause after a count changed.
    fn settle(&mut self) {
        let still = self.pauses_held > 0 && self.pauses_held >= self.active_calls;
        match (self.paused_since, still) {
            (None, true) => self.paused_since = Some(Instant::now()),
            (Some(since), false) => {
                self.paused_total += since.elapsed();
                self.paused_since = None;
            }
            _ => {}
        }
    }
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
                active_calls: 0,
                paused_since: None,
            })),
        }
    }

    /// Marks one call waiting for a person until the returned guard is dropped; the clock
    /// stops while every call in flight is so marked. Pauses nest.
    pub fn pause(&self) -> PauseGuard {
        let mut s = lock(&self.inner);
        s.pauses_held += 1;
        s.settle();
        PauseGuard {
            inner: self.inner.clone(),
        }
    }

    /// Counts one of the script's calls in flight until the returned guard is dropped.
    pub fn call_active(&self) -> ActiveCall {
        let mut s = lock(&self.inner);
        s.active_calls += 1;
        s.settle();
        ActiveCall {
            inner: self.inner.clone(),
        }
    }

    /// True while the clock stands still.
    pub fn is_paused(&self) -> bool {
        lock(&self.inner).paused_since.is_some()
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
        s.settle();
    }
}

/// One of the script's calls in flight, counted by its [`DeadlineClock`] while alive.
#[derive(Debug)]
pub struct ActiveCall {
    inner: Arc<Mutex<ClockState>>,
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        let mut s = lock(&self.inner);
        s.active_calls = s.active_calls.saturating_sub(1);
        s.settle();
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

    #[test]
    fn a_pending_question_does_not_stop_the_clock_while_other_calls_run() {
        let clock = DeadlineClock::new();
        let asked = clock.call_active();
        let question = clock.pause();
        assert!(clock.is_paused(), "the only call waits for a person");
        let other = clock.call_active();
        assert!(!clock.is_paused(), "another call runs meanwhile");
        std::thread::sleep(Duration::from_millis(60));
        drop(other);
        assert!(clock.is_paused(), "back to waiting on the person alone");
        drop(question);
        drop(asked);
        assert!(!clock.is_paused());
        assert!(
            clock.running() >= Duration::from_millis(60),
            "the other call's time counts: {:?}",
            clock.running()
        );
    }
}
