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
    }
    Ok(())
}
