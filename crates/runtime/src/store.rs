//! `store()`/`load()` values, kept per session.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use codemode_sandbox::StoreWrite;
use serde_json::Value;

#[derive(Default)]
pub(crate) struct SessionStores {
    by_session: Mutex<HashMap<String, BTreeMap<String, Value>>>,
}

impl SessionStores {
    pub(crate) fn snapshot(&self, session: &str) -> BTreeMap<String, Value> {
        self.lock().get(session).cloned().unwrap_or_default()
    }

    /// Applies a successful script's writes in the order it made them.
    pub(crate) fn apply(&self, session: &str, writes: &[StoreWrite]) {
        let mut all = self.lock();
        let store = all.entry(session.to_string()).or_default();
        for write in writes {
            match write {
                StoreWrite::Set { key, value } => {
                    store.insert(key.clone(), value.clone());
                }
                StoreWrite::Delete { key, .. } => {
                    store.remove(key);
                }
            }
        }
    }

    pub(crate) fn remove(&self, session: &str) {
        self.lock().remove(session);
    }

    // A poisoned lock means a panic elsewhere; the map itself is still consistent.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, Value>>> {
        self.by_session.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A script's writes as the state store takes them.
pub(crate) fn changes(writes: &[StoreWrite]) -> Vec<codemode_state::StoreChange> {
    writes
        .iter()
        .map(|w| match w {
            StoreWrite::Set { key, value } => codemode_state::StoreChange::Set {
                key: key.clone(),
                value: value.clone(),
            },
            StoreWrite::Delete { key, .. } => {
                codemode_state::StoreChange::Delete { key: key.clone() }
            }
        })
        .collect()
}
