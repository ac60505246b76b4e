//! Each principal's share of the sandbox pool in this process.
//!
//! A running cell holds a pool worker until its script ends, while a call waits for a person
//! too, and the pool is shared by every token. `cells.max_per_session` bounds one session, but
//! one token may keep many sessions, so without this count one token's paused cells could hold
//! every worker and leave everyone else's scripts queued until their approvals expire.
//! The count is per process: the pool it protects is this process's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Cells running in this process, by the principal they act for (`""`: sessions acting for
/// nobody, counted together).
#[derive(Default)]
pub(crate) struct PrincipalShare {
    running: Mutex<HashMap<String, u32>>,
}

/// One running cell in its principal's count; given back when dropped.
pub(crate) struct ShareSlot {
    share: Arc<PrincipalShare>,
    principal: String,
}

impl PrincipalShare {
    /// A slot for `principal`, or `None` when it already runs `limit` cells here.
    pub fn take(self: &Arc<Self>, principal: &str, limit: u32) -> Option<ShareSlot> {
        let mut running = self.lock();
        let n = running.entry(principal.to_string()).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(self.slot(principal))
    }

    /// A slot whatever the count: for a cell taken over from a stopped process, which runs
    /// anyway (refusing it would fail work already admitted) but holds a worker all the same.
    pub fn take_anyway(self: &Arc<Self>, principal: &str) -> ShareSlot {
        *self.lock().entry(principal.to_string()).or_insert(0) += 1;
        self.slot(principal)
    }

    fn slot(self: &Arc<Self>, principal: &str) -> ShareSlot {
        ShareSlot {
            share: self.clone(),
            principal: principal.to_string(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ShareSlot {
    fn drop(&mut self) {
        let mut running = self.share.lock();
        if let Some(n) = running.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_at_its_limit_is_refused_and_others_are_not() {
        let share = Arc::new(PrincipalShare::default());
        let a1 = share.take("alice", 2).expect("first");
        let _a2 = share.take("alice", 2).expect("second");
        assert!(share.take("alice", 2).is_none(), "third refused");
        let _b = share.take("bob", 2).expect("bob has his own share");
        drop(a1);
        assert!(
            share.take("alice", 2).is_some(),
            "a slot given back is free"
        );
        let _over = share.take_anyway("alice");
        assert!(share.take("alice", 2).is_none(), "taken-over cells count");
    }
}
