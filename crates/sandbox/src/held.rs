//! Bytes of call answers the host holds for one script: answers that arrived and wait for the
//! VM to take them. A script can start thousands of calls whose answers are each up to an MCP
//! message (16 MiB); past a bound, a further answer is dropped and the script gets an error in
//! its place, so the host's memory for one script stays bounded whatever it awaits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::host::HostError;

/// The least the host keeps for one script, whatever its heap limit.
const MIN_HELD: usize = 64 << 20;

#[derive(Clone)]
pub(crate) struct HeldAnswers {
    bytes: Arc<AtomicUsize>,
    max: usize,
}

impl HeldAnswers {
    /// Bounded by the script's heap: more than that of answers could never be in the VM at once.
    pub(crate) fn new(heap_bytes: usize) -> Self {
        HeldAnswers {
            bytes: Arc::new(AtomicUsize::new(0)),
            max: heap_bytes.max(MIN_HELD),
        }
    }

    /// Counts an answer that arrived, or replaces it with an error when it does not fit.
    pub(crate) fn admit(&self, r: Result<String, HostError>) -> Result<String, HostError> {
        let Ok(text) = r else { return r };
        let n = text.len();
        let before = self.bytes.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) <= self.max {
            return Ok(text);
        }
        self.bytes.fetch_sub(n, Ordering::AcqRel);
        Err(HostError::new(format!(
            "The call ran, but its answer ({}) was dropped: the script already has {} of answers \
             waiting that it has not taken, and at most {} may wait (its heap limit). Await large \
             calls a few at a time, or ask the tool for less.",
            size(n),
            size(before),
            size(self.max)
        )))
    }

    /// Counts an answer that must be delivered whatever its size (one replayed from a log).
    pub(crate) fn count(&self, r: &Result<String, HostError>) {
        if let Ok(text) = r {
            self.bytes.fetch_add(text.len(), Ordering::AcqRel);
        }
    }

    /// The answer left the host's keeping: taken by the VM, or thrown away.
    pub(crate) fn release(&self, r: &Result<String, HostError>) {
        if let Ok(text) = r {
            self.bytes.fetch_sub(text.len(), Ordering::AcqRel);
        }
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::HeldAnswers;

    #[test]
    fn answers_past_the_bound_are_dropped_and_taking_one_makes_room() {
        let held = HeldAnswers::new(0);
        let big = || Ok("x".repeat(20 << 20));
        let kept: Vec<_> = (0..4).map(|_| held.admit(big())).collect();
        assert!(kept[..3].iter().all(Result::is_ok));
        let e = kept[3].as_ref().unwrap_err();
        assert!(
            e.message.contains("The call ran, but its answer"),
            "{}",
            e.message
        );
        assert_eq!(held.held(), 60 << 20);
        held.release(&kept[0]);
        assert!(held.admit(big()).is_ok());
        held.release(&Err(crate::host::HostError::new("errors hold nothing")));
        assert_eq!(held.held(), 60 << 20);
    }
}
