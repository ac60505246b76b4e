//! At most four model calls of one script at a time, as in the reference: a script that fires a
//! hundred classifications with `Promise.all` queues them instead of hammering the provider.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Calls of one script that may run at once.
pub const MODEL_CALLS_PER_SCRIPT: usize = 4;

/// One FIFO semaphore per script id, shared by all model tools and dropped with the last permit.
#[derive(Default)]
pub(crate) struct ScriptLimiter {
    scripts: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl ScriptLimiter {
    /// Waits for a slot of `script_id`. Dropping the future while it waits gives up its place
    /// (tokio's semaphore is cancellation-safe). Calls without a script id are not limited.
    pub(crate) async fn acquire(&self, script_id: Option<&str>) -> Option<OwnedSemaphorePermit> {
        let script_id = script_id?;
        let semaphore = {
            let mut scripts = match self.scripts.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            scripts.retain(|_, s| s.strong_count() > 0);
            match scripts.get(script_id).and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    let s = Arc::new(Semaphore::new(MODEL_CALLS_PER_SCRIPT));
                    scripts.insert(script_id.to_string(), Arc::downgrade(&s));
                    s
                }
            }
        };
        // The semaphore is never closed, so acquiring fails only if it were; then run unlimited
        // rather than fail the call for a reason the script cannot fix.
        semaphore.acquire_owned().await.ok()
    }
}
