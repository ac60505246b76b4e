//! What the gate keeps per session (its principal; its "always" answers and counters live
//! beside it in `Inner`), and when it may let go of it.
//!
//! A session that ends ([`super::Gate::forget_session`]) is dropped at once when nothing of
//! it runs in this process. A call or a cell still running then holds it
//! ([`SessionHold`]): the session is dropped when the last hold goes, so that what still runs
//! acts for the session's principal, and counts against its budget, to its end. Dropping
//! early would make it act for the process's default principal; never dropping it would let
//! a client that opens and abandons sessions grow the host's memory without bound.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::budget::Principal;

use super::Inner;

#[derive(Default)]
pub(crate) struct SessionMemory {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Who each session acts for (HTTP token names).
    principals: HashMap<String, Principal>,
    /// How many calls and cells of each session run now.
    holds: HashMap<String, usize>,
    /// Sessions that ended while held: forgotten when their last hold goes.
    ended: HashSet<String>,
    /// Sessions known here only through what runs of them (a cell taken over from another
    /// process): forgotten when their last hold goes, unless a client begins them here.
    lent: HashSet<String>,
}

impl SessionMemory {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn principal(&self, session_id: &str) -> Option<Principal> {
        self.lock().principals.get(session_id).cloned()
    }

    /// A session that acts for `principal` from now on (a live session, even if it had been
    /// told to end: it was begun again here).
    pub(crate) fn set_principal(&self, session_id: &str, principal: Principal) {
        let mut state = self.lock();
        state.ended.remove(session_id);
        state.lent.remove(session_id);
        state.principals.insert(session_id.to_string(), principal);
    }

    /// `principal` for a session only while something of it runs here; a session already
    /// known here keeps what it has.
    pub(crate) fn lend_principal(&self, session_id: &str, principal: Principal) {
        let mut state = self.lock();
        if state.principals.contains_key(session_id) {
            return;
        }
        state.lent.insert(session_id.to_string());
        state.principals.insert(session_id.to_string(), principal);
    }

    /// Whether the session ended while something of it still runs here.
    pub(crate) fn has_ended(&self, session_id: &str) -> bool {
        self.lock().ended.contains(session_id)
    }

    /// The sessions with a principal here.
    pub(crate) fn with_principal(&self) -> Vec<String> {
        self.lock().principals.keys().cloned().collect()
    }

    /// The session ended: `forget` runs now if nothing holds it, else when its last hold goes.
    /// It runs under this memory's lock, so no hold or principal slips in meanwhile.
    pub(crate) fn end(&self, session_id: &str, forget: impl FnOnce(&str)) {
        let mut state = self.lock();
        if state.holds.contains_key(session_id) {
            state.ended.insert(session_id.to_string());
            return;
        }
        state.lent.remove(session_id);
        state.principals.remove(session_id);
        forget(session_id);
    }

    fn hold(&self, session_id: &str) {
        *self.lock().holds.entry(session_id.to_string()).or_default() += 1;
    }

    fn release(&self, session_id: &str, forget: impl FnOnce(&str)) {
        let mut state = self.lock();
        let Some(n) = state.holds.get_mut(session_id) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n > 0 {
            return;
        }
        state.holds.remove(session_id);
        let lent = state.lent.remove(session_id);
        if state.ended.remove(session_id) || lent {
            state.principals.remove(session_id);
            forget(session_id);
        }
    }
}

/// Keeps a session's principal and counters while a call or a cell of it runs, even past the
/// session's end (see the module docs).
pub struct SessionHold {
    gate: Arc<Inner>,
    session_id: String,
}

impl SessionHold {
    pub(crate) fn new(gate: Arc<Inner>, session_id: &str) -> Self {
        gate.sessions.hold(session_id);
        SessionHold {
            gate,
            session_id: session_id.to_string(),
        }
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        let gate = &self.gate;
        gate.sessions
            .release(&self.session_id, |id| gate.forget_session_now(id));
    }
}

impl std::fmt::Debug for SessionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHold")
            .field("session_id", &self.session_id)
            .finish()
    }
}
