//! Bytes of call answers the host holds for one script: answers that arrived and wait for the
//! VM to take them. A script can start thousands of calls whose answers are each up to an MCP
//! message (16 MiB); past a bound, a further answer is dropped and the script gets an error in
//! its place, so the host's memory for one script stays bounded whatever it awaits.
//!
//! An answer is counted from before it reaches the sandbox, too: the host's call sees an
//! [`AnswerRoom`] and reserves the size of a result as soon as the tool returns it, so results
//! waiting on their way (for hooks, the audit log, a thread to convert them) count against the
//! same bound, and one that does not fit is dropped there, not after it has been copied.

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

    /// Reserves `n` bytes for a result on its way, or says why it does not fit.
    fn reserve(&self, n: usize) -> Result<AnswerShare, String> {
        let before = self.bytes.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) <= self.max {
            return Ok(AnswerShare {
                held: self.clone(),
                n,
            });
        }
        self.bytes.fetch_sub(n, Ordering::AcqRel);
        Err(self.dropped(n, before))
    }

    fn dropped(&self, n: usize, before: usize) -> String {
        format!(
            "The call ran, but its answer ({}) was dropped: {}",
            size(n),
            self.waiting(before)
        )
    }

    /// Gives back `n` bytes. Saturating: an answer released without being counted must not wrap
    /// the count, which would then drop every later answer.
    fn give_back(&self, n: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    fn waiting(&self, before: usize) -> String {
        format!(
            "the script already has {} of answers waiting that it has not taken, and at most {} \
             may wait (its heap limit). Await large calls a few at a time, or ask the tool for less.",
            size(before),
            size(self.max)
        )
    }

    /// Counts an answer that arrived, or replaces it with a short error when it does not fit.
    /// Errors count too: a tool's error message may be as large as a result.
    pub(crate) fn admit(&self, r: Result<String, HostError>) -> Result<String, HostError> {
        let n = bytes_of(&r);
        let before = self.bytes.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) <= self.max {
            return r;
        }
        self.bytes.fetch_sub(n, Ordering::AcqRel);
        let waiting = self.waiting(before);
        let replacement = Err(match r {
            Ok(_) => HostError::new(self.dropped(n, before)),
            // Failed anyway: what failed is kept, in brief, with its small fields (its stage).
            Err(e) => HostError {
                message: format!(
                    "The call failed, and its error ({}) was cut: {waiting} It began: {}",
                    size(n),
                    e.message.chars().take(500).collect::<String>()
                ),
                name: e.name,
                properties: e
                    .properties
                    .into_iter()
                    .filter(|(_, v)| codemode_spec::json_text_len(v) <= 1024)
                    .collect(),
            },
        });
        // Counted too, past the bound if need be: it is small, and its release takes it back.
        self.bytes
            .fetch_add(bytes_of(&replacement), Ordering::AcqRel);
        replacement
    }

    /// Counts an answer that must be delivered whatever its size (one replayed from a log).
    pub(crate) fn count(&self, r: &Result<String, HostError>) {
        self.bytes.fetch_add(bytes_of(r), Ordering::AcqRel);
    }

    /// The answer left the host's keeping: taken by the VM, or thrown away.
    pub(crate) fn release(&self, r: &Result<String, HostError>) {
        self.give_back(bytes_of(r));
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// Where a script's call results wait: a call reserves its result's size here as soon as the
/// tool returns it. Cloned into each [`crate::HostCall`].
#[derive(Clone)]
pub struct AnswerRoom(pub(crate) HeldAnswers);

impl std::fmt::Debug for AnswerRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerRoom")
            .field("held", &self.0.bytes.load(Ordering::Relaxed))
            .field("max", &self.0.max)
            .finish()
    }
}

impl AnswerRoom {
    /// Room for `bytes` of result, held until the share is dropped; or, when the script already
    /// holds as much as may wait, the error the script should get instead of the result.
    pub fn reserve(&self, bytes: usize) -> Result<AnswerShare, String> {
        self.0.reserve(bytes)
    }

    /// A room without bound, for calls made outside a script (tests, embedders' own calls).
    pub fn unbounded() -> Self {
        AnswerRoom(HeldAnswers {
            bytes: Arc::new(AtomicUsize::new(0)),
            max: usize::MAX,
        })
    }
}

/// Bytes of a result reserved in its script's [`AnswerRoom`], given back when dropped.
pub struct AnswerShare {
    held: HeldAnswers,
    n: usize,
}

impl Drop for AnswerShare {
    fn drop(&mut self) {
        self.held.give_back(self.n);
    }
}

/// What an answer holds: a result's text, or an error's message, name and fields.
fn bytes_of(r: &Result<String, HostError>) -> usize {
    match r {
        Ok(text) => text.len(),
        Err(e) => {
            let fields: usize = e
                .properties
                .iter()
                .map(|(k, v)| k.len() + codemode_spec::json_text_len(v))
                .sum();
            e.message.len() + e.name.as_ref().map_or(0, String::len) + fields
        }
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
        // The short error in its place counts too, until it is taken.
        assert_eq!(held.held(), (60 << 20) + e.message.len());
        held.release(&kept[0]);
        assert!(held.admit(big()).is_ok());
        held.release(&kept[3]);
        assert_eq!(held.held(), 60 << 20);
    }

    /// Red team: results waiting between the tool and the sandbox were not counted, so 400
    /// answers of 1 MiB waiting for a script that computed took the host to 1.3 GB. A result
    /// is counted from when the tool returns it, in the same bound as answers that arrived.
    #[test]
    fn results_on_their_way_share_the_bound_with_answers_that_arrived() {
        let held = HeldAnswers::new(0);
        let room = super::AnswerRoom(held.clone());
        let shares: Vec<_> = (0..3).map(|_| room.reserve(20 << 20).unwrap()).collect();
        let refused = room.reserve(20 << 20).err().unwrap();
        assert!(
            refused.starts_with("The call ran, but its answer (20.0 MiB) was dropped"),
            "{refused}"
        );
        let replaced = held.admit(Ok("x".repeat(20 << 20)));
        assert!(replaced.is_err(), "answers that arrived share the bound");
        held.release(&replaced);
        drop(shares);
        assert_eq!(held.held(), 0, "a share is given back when dropped");
        assert!(held.admit(Ok("x".repeat(20 << 20))).is_ok());
        assert!(room.reserve(40 << 20).is_ok());
        assert!(
            super::AnswerRoom::unbounded()
                .reserve(usize::MAX / 2)
                .is_ok()
        );
    }

    /// Red team: errors were not counted, so a server answering each of 80 calls with a 15 MiB
    /// error while the script did not take them held them all (895 MB and rising).
    #[test]
    fn large_errors_count_and_are_cut_past_the_bound() {
        let held = HeldAnswers::new(0);
        let big_error = || {
            let mut e = crate::host::HostError::new("e".repeat(20 << 20));
            e.name = Some("ToolError".into());
            e.properties.insert("stage".into(), "execute".into());
            Err(e)
        };
        let kept: Vec<_> = (0..4).map(|_| held.admit(big_error())).collect();
        assert!(
            held.held() >= 60 << 20 && held.held() < 61 << 20,
            "{}",
            held.held()
        );
        let cut = kept[3].as_ref().unwrap_err();
        assert!(
            cut.message.starts_with("The call failed, and its error"),
            "{:.200}",
            cut.message
        );
        assert!(cut.message.len() < 2000);
        assert_eq!(cut.name.as_deref(), Some("ToolError"));
        assert_eq!(cut.properties["stage"], "execute");
        held.release(&kept[3]);
        held.release(&kept[0]);
        assert!(
            held.admit(big_error())
                .is_err_and(|e| e.message.len() == 20 << 20)
        );
    }
}
