//! Sessions and their `store()` values: what a client session keeps between scripts, keyed by
//! session id so that the session can move between replicas.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Result;
use crate::validate::{check_id, check_text};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub id: String,
    /// Who the session belongs to, set when it is first seen and never changed: a caller that
    /// presents the same session id as someone else must be refused by comparing this.
    pub principal: Option<String>,
    pub created_at_ms: i64,
    pub last_seen_ms: i64,
}

/// How long the mark of a session ended for good is kept: far longer than any request that
/// was under way on another replica when it ended, after which it is pruned (its id, random,
/// is not used again).
pub const ENDED_SESSION_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// The error for a session that has ended.
pub(crate) fn ended(id: &str) -> crate::StateError {
    crate::StateError::SessionEnded { id: id.to_string() }
}

/// One write of a script's `store()`/`delete`, applied in order and all together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum StoreChange {
    Set { key: String, value: Value },
    Delete { key: String },
}

impl StoreChange {
    pub fn key(&self) -> &str {
        match self {
            StoreChange::Set { key, .. } | StoreChange::Delete { key } => key,
        }
    }
}

/// Keys are at most this many bytes.
pub const MAX_STORE_KEY_BYTES: usize = 1024;

/// One value's JSON text is at most this many characters: the script API's own limit, held
/// here too so that a worker that skipped its checks, or writes from cells running side by
/// side, cannot grow a session past it.
pub const MAX_STORE_VALUE_CHARS: usize = 262_144;

/// All of a session's keys and values' JSON texts together are at most this many characters.
pub const MAX_STORE_TOTAL_CHARS: usize = 1_048_576;

/// Characters as the stores count them (code points: never more than the script's UTF-16
/// count, so a write the script API took is not refused here for its length alone).
pub(crate) fn chars(text: &str) -> usize {
    text.chars().count()
}

/// The error for a session whose values would pass [`MAX_STORE_TOTAL_CHARS`].
pub(crate) fn store_full(session: &str, total: usize) -> crate::StateError {
    crate::StateError::invalid(
        "store() write",
        format!(
            "the values of session `{session}` would be {total} characters of JSON together; the most is {MAX_STORE_TOTAL_CHARS}. Nothing of this script's store() writes was kept: remove keys with store(key, undefined), and keep big data elsewhere"
        ),
    )
}

/// The characters one stored entry counts for.
pub(crate) fn entry_chars(key: &str, json: &str) -> usize {
    chars(key) + chars(json)
}

pub(crate) fn validate_changes(session: &str, changes: &[StoreChange]) -> Result<()> {
    check_id("session id", session)?;
    for c in changes {
        let key = c.key();
        if key.len() > MAX_STORE_KEY_BYTES {
            return Err(crate::StateError::invalid(
                "store key",
                format!(
                    "`{}…` is {} bytes long; the most is {MAX_STORE_KEY_BYTES}",
                    key.chars().take(40).collect::<String>(),
                    key.len()
                ),
            ));
        }
        check_text("store key", key)?;
        if let StoreChange::Set { value, .. } = c {
            let n = chars(&crate::validate::json_text(value));
            if n > MAX_STORE_VALUE_CHARS {
                return Err(crate::StateError::invalid(
                    "store() write",
                    format!(
                        "the value under `{}` is {n} characters of JSON; one value may be at most {MAX_STORE_VALUE_CHARS}",
                        key.chars().take(40).collect::<String>()
                    ),
                ));
            }
        }
    }
    Ok(())
}
