//! A bound on the memory that the large results of the built-in tools hold together.
//!
//! Each call is bounded on its own (an image read returns at most 20 MB), but a script may have
//! thousands of calls in flight, the blocking pool runs hundreds at once, and finished results
//! wait for the script to take them: 64 parallel reads of a 19 MB image took one `codemode run`
//! to 3.6 GB. A call that builds a large result first takes its share here, waiting while others
//! hold the rest, and the result keeps the share until it is dropped.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::support::StopFlag;

/// How often a waiting call looks whether it was cancelled.
const STOP_POLL: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub(crate) struct ByteBudget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

/// A share of a [`ByteBudget`], given back when dropped.
pub(crate) struct HeldBytes {
    budget: Arc<ByteBudget>,
    bytes: u64,
}

impl ByteBudget {
    pub(crate) fn new(limit: u64) -> Self {
        ByteBudget {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits until `bytes` fit beside what others hold, and holds them; `None` once `stop` is
    /// set. A request larger than the whole budget is taken as the whole budget, so it runs
    /// alone rather than never.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64, stop: &StopFlag) -> Option<HeldBytes> {
        let bytes = bytes.min(self.limit);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while *used + bytes > self.limit {
            if stop.is_set() {
                return None;
            }
            used = self
                .freed
                .wait_timeout(used, STOP_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *used += bytes;
        drop(used);
        Some(HeldBytes {
            budget: self.clone(),
            bytes,
        })
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        let mut used = self
            .budget
            .used
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *used -= self.bytes;
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn holders_never_exceed_the_limit_and_a_large_request_runs_alone() {
        let budget = Arc::new(ByteBudget::new(100));
        let now = Arc::new(AtomicU64::new(0));
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = [40u64, 40, 40, 40, 500, 30, 30, 30]
            .into_iter()
            .map(|bytes| {
                let (now, peak, budget) = (now.clone(), peak.clone(), budget.clone());
                std::thread::spawn(move || {
                    let held = budget.hold(bytes, &StopFlag::default()).unwrap();
                    let charged = bytes.min(100);
                    let total = now.fetch_add(charged, Ordering::SeqCst) + charged;
                    peak.fetch_max(total, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    now.fetch_sub(charged, Ordering::SeqCst);
                    drop(held);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::SeqCst) <= 100);
        assert_eq!(*budget.used.lock().unwrap(), 0);
    }

    #[test]
    fn a_waiting_call_gives_up_when_stopped() {
        let budget = Arc::new(ByteBudget::new(10));
        let held = budget.hold(10, &StopFlag::default()).unwrap();
        let stop = StopFlag::default();
        stop.set();
        assert!(budget.hold(1, &stop).is_none());
        drop(held);
        assert!(budget.hold(10, &StopFlag::default()).is_some());
    }
}
