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
/// waiting on anyone, and its time counts. Nor is a script that computes meanwhile: while the
/// clock stands still, the time its code computes (read from the VM's CPU clock, a [`Meter`]
/// the sandbox sets) counts. Cloning shares the clock.
#[derive(Debug, Clone)]
pub struct DeadlineClock {
    inner: Arc<Mutex<ClockState>>,
}

#[derive(Debug)]
struct ClockState {
    started: Instant,
    /// Running time this script had before this clock started: a cell rebuilt in another
    /// process goes on from what its log recorded, not from zero.
    carried: Duration,
    /// While the rebuilt script replays its log, it re-does work the carried time already
    /// counts: the clock reads the larger of the two. Once caught up, what the carried time
    /// has beyond the replay (the first process's waits on tools) is added for good.
    caught_up: bool,
    extra: Duration,
    paused_total: Duration,
    pauses_held: usize,
    /// The script's calls in flight, as the sandbox counts them.
    active_calls: usize,
    paused_since: Option<Instant>,
    /// The VM's compute time, while the sandbox runs the script.
    meter: Option<MeterFn>,
    /// The meter's reading when the current pause began.
    metered_from: Option<Duration>,
    /// Time the script computed while the clock stood still, in pauses that ended.
    computed_in_pauses: Duration,
}

/// Reads the CPU time of what runs the script's code (the worker process, or the VM's thread);
/// only differences between readings are used.
pub type Meter = Arc<dyn Fn() -> Duration + Send + Sync>;

struct MeterFn(Meter);

impl std::fmt::Debug for MeterFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Meter")
    }
}

impl ClockState {
    /// Wall time since this clock started, less paused time in which the script's code did
    /// not compute.
    fn own(&self) -> Duration {
        let now = Instant::now();
        let paused_now = self.paused_since.map(|p| now - p).unwrap_or_default();
        let computing_now = self.computed_since_pause().min(paused_now);
        (now - self.started).saturating_sub(self.paused_total + paused_now)
            + self.computed_in_pauses
            + computing_now
    }

    /// What the meter counted since the current pause began.
    fn computed_since_pause(&self) -> Duration {
        match (&self.meter, self.metered_from) {
            (Some(meter), Some(from)) if self.paused_since.is_some() => {
                (meter.0)().saturating_sub(from)
            }
            _ => Duration::ZERO,
        }
    }

    /// Starts or ends the current pause after a count changed.
    fn settle(&mut self) {
        let still = self.pauses_held > 0 && self.pauses_held >= self.active_calls;
        match (self.paused_since, still) {
            (None, true) => {
                self.paused_since = Some(Instant::now());
                self.metered_from = self.meter.as_ref().map(|m| (m.0)());
            }
            (Some(since), false) => {
                let computed = self.computed_since_pause().min(since.elapsed());
                self.computed_in_pauses += computed;
                self.paused_total += since.elapsed();
                self.paused_since = None;
                self.metered_from = None;
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
        Self::carrying(Duration::ZERO)
    }

    /// A clock for a script that ran `already` before (in a process that stopped) and is
    /// replayed here: it reads at least `already` until [`DeadlineClock::catch_up`], and
    /// `already` plus what runs after the replay from then on.
    pub fn carrying(already: Duration) -> Self {
        DeadlineClock {
            inner: Arc::new(Mutex::new(ClockState {
                started: Instant::now(),
                carried: already,
                caught_up: already.is_zero(),
                extra: Duration::ZERO,
                paused_total: Duration::ZERO,
                pauses_held: 0,
                active_calls: 0,
                paused_since: None,
                meter: None,
                metered_from: None,
                computed_in_pauses: Duration::ZERO,
            })),
        }
    }

    /// Counts what `meter` reads while the clock stands still, until the returned guard is
    /// dropped: the sandbox sets it for as long as a VM runs the script.
    pub fn metered_by(&self, meter: Meter) -> MeterGuard {
        let mut s = lock(&self.inner);
        if s.paused_since.is_some() {
            s.metered_from = Some(meter());
        }
        s.meter = Some(MeterFn(meter));
        MeterGuard {
            inner: self.inner.clone(),
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

    /// Time counted against the deadline: wall time since start, less paused time, with the
    /// carried time (see [`DeadlineClock::carrying`]).
    pub fn running(&self) -> Duration {
        let s = lock(&self.inner);
        let own = s.own();
        if s.caught_up {
            own + s.extra
        } else {
            own.max(s.carried)
        }
    }

    /// The script has re-done the part of its run the carried time covers (a rebuilt cell
    /// answered its last logged call): from now on the carried time counts on top of what
    /// this process runs, less what the replay took.
    pub fn catch_up(&self) {
        let mut s = lock(&self.inner);
        if !s.caught_up {
            s.extra = s.carried.saturating_sub(s.own());
            s.caught_up = true;
        }
    }

    /// The running time carried over from before this clock started.
    pub fn carried(&self) -> Duration {
        lock(&self.inner).carried
    }

    /// Total time spent paused so far.
    pub fn paused(&self) -> Duration {
        let s = lock(&self.inner);
        s.paused_total + s.paused_since.map(|p| p.elapsed()).unwrap_or_default()
    }
}

/// Keeps a [`Meter`] on a [`DeadlineClock`] while alive; what it counted in the current pause
/// stays counted.
pub struct MeterGuard {
    inner: Arc<Mutex<ClockState>>,
}

impl Drop for MeterGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.inner);
        let paused_now = s.paused_since.map(|p| p.elapsed()).unwrap_or_default();
        let computed = s.computed_since_pause().min(paused_now);
        // Moved out of the pause: the pause goes on, the time computed in it stays counted.
        s.computed_in_pauses += computed;
        if let Some(since) = s.paused_since {
            s.paused_total += since.elapsed();
            s.paused_since = Some(Instant::now());
        }
        s.meter = None;
        s.metered_from = None;
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

    /// A meter standing in for the VM's CPU clock, moved by hand.
    fn fake_meter() -> (Meter, Arc<std::sync::atomic::AtomicU64>) {
        let ms = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
        let read = ms.clone();
        let meter: Meter =
            Arc::new(move || Duration::from_millis(read.load(std::sync::atomic::Ordering::SeqCst)));
        (meter, ms)
    }

    #[test]
    fn computing_while_paused_counts() {
        let clock = DeadlineClock::new();
        let (meter, ms) = fake_meter();
        let metered = clock.metered_by(meter);
        let pause = clock.pause();
        std::thread::sleep(Duration::from_millis(120));
        ms.fetch_add(80, std::sync::atomic::Ordering::SeqCst);
        let running = clock.running();
        assert!(
            running >= Duration::from_millis(80) && running < Duration::from_millis(115),
            "{running:?}"
        );
        drop(pause);
        let after = clock.running();
        assert!(after >= Duration::from_millis(80) && after < Duration::from_millis(400));
        // Computing outside a pause is wall time already: the meter adds nothing then.
        ms.fetch_add(500, std::sync::atomic::Ordering::SeqCst);
        assert!(
            clock.running() < Duration::from_millis(400),
            "{:?}",
            clock.running()
        );
        // Taking the meter away keeps what it counted in a pause still going.
        let pause = clock.pause();
        ms.fetch_add(20, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(40));
        drop(metered);
        ms.fetch_add(1_000, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(40));
        let running = clock.running();
        assert!(
            running >= Duration::from_millis(100) && running < Duration::from_millis(400),
            "{running:?}"
        );
        drop(pause);
    }

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

    #[test]
    fn carried_time_counts_once_past_the_replay() {
        let clock = DeadlineClock::carrying(Duration::from_millis(500));
        assert!(clock.running() >= Duration::from_millis(500));
        // Replaying re-does work the carried time counts: not added on top.
        std::thread::sleep(Duration::from_millis(30));
        assert!(clock.running() < Duration::from_millis(530));
        clock.catch_up();
        std::thread::sleep(Duration::from_millis(40));
        let r = clock.running();
        assert!(r >= Duration::from_millis(540), "{r:?}");
        assert!(r < Duration::from_millis(800), "{r:?}");
        // A replay that took longer than the time it carried counts its own time.
        let slow = DeadlineClock::carrying(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(40));
        slow.catch_up();
        let r = slow.running();
        assert!(
            r >= Duration::from_millis(40) && r < Duration::from_millis(300),
            "{r:?}"
        );
    }
}
