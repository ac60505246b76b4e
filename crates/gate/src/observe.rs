//! Watching calls from outside the gate (metrics), without the gate knowing how they are kept.

use crate::outcome::CallOutcome;

/// Told about every call's outcome, once, as its audit line is written. Keep it quick: it runs
/// on the call's path.
pub trait CallObserver: Send + Sync + 'static {
    fn finished(&self, outcome: &CallOutcome);
}
