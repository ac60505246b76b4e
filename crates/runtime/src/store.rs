//! `store()`/`load()` values, kept per session.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use codemode_sandbox::StoreWrite;
use codemode_state::{MAX_STORE_TOTAL_CHARS, MAX_STORE_VALUE_CHARS};
use serde_json::Value;

/// Values are kept as their JSON text: the limits count characters, and a short text of small
/// values (`[0,0,…]`) is tens of times larger decoded, in every session kept here.
#[derive(Default)]
pub(crate) struct SessionStores {
    by_session: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl SessionStores {
    pub(crate) fn snapshot(&self, session: &str) -> BTreeMap<String, Value> {
        let texts = self.lock().get(session).cloned().unwrap_or_default();
        texts
            .into_iter()
            .filter_map(|(k, text)| Some((k, serde_json::from_str(&text).ok()?)))
            .collect()
    }

    /// Applies a successful script's writes in the order it made them, all or none: a batch
    /// that would put a value or the session past the store's limits is refused whole. The
    /// script API checks the same limits in the VM; this holds them for a worker that did not,
    /// and for scripts of one session that each fit but together would not. Only without a
    /// durable store: with one, scripts load from it and nothing is kept here. `ended` is asked under this map's lock, which [`SessionStores::remove`] takes too: a
    /// session that ends is either removed after these writes or refuses them with
    /// `ended_why`, never given them back after its removal.
    pub(crate) fn apply(
        &self,
        session: &str,
        writes: &[StoreWrite],
        ended: impl Fn() -> bool,
        ended_why: &str,
    ) -> Result<(), String> {
        let mut all = self.lock();
        if ended() {
            return Err(ended_why.to_string());
        }
        let mut store = all.get(session).cloned().unwrap_or_default();
        for write in writes {
            match write {
                StoreWrite::Set { key, value } => {
                    let text = serde_json::to_string(value).map_err(|e| {
                        format!("the value stored under {key:?} cannot be written as JSON: {e}")
                    })?;
                    let n = text.chars().count();
                    if n > MAX_STORE_VALUE_CHARS {
                        return Err(format!(
                            "the value stored under {key:?} is {n} characters of JSON; one value may be at most {MAX_STORE_VALUE_CHARS}"
                        ));
                    }
                    store.insert(key.clone(), text);
                }
                StoreWrite::Delete { key, .. } => {
                    store.remove(key);
                }
            }
        }
        let total: usize = store
            .iter()
            .map(|(k, v)| k.chars().count() + v.chars().count())
            .sum();
        if total > MAX_STORE_TOTAL_CHARS {
            return Err(format!(
                "the session's store() values would be {total} characters of JSON together; the most is {MAX_STORE_TOTAL_CHARS}. Remove keys with store(key, undefined), and keep big data elsewhere"
            ));
        }
        all.insert(session.to_string(), store);
        Ok(())
    }

    pub(crate) fn remove(&self, session: &str) {
        self.lock().remove(session);
    }

    // A poisoned lock means a panic elsewhere; the map itself is still consistent.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, String>>> {
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
