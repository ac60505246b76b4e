//! Checks on what callers pass in, so bad input fails the same clear way on every backend
//! (PostgreSQL, for one, refuses NUL bytes in text that SQLite would take).

use serde_json::Value;

use crate::error::{Result, StateError};

/// Ids are at most this many bytes (they travel in PostgreSQL notifications, capped at 8000).
pub const MAX_ID_BYTES: usize = 256;

pub(crate) fn check_id(what: &'static str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(StateError::invalid(what, "it is empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(StateError::invalid(
            what,
            format!("it is {} bytes long; the most is {MAX_ID_BYTES}", id.len()),
        ));
    }
    check_text(what, id)
}

pub(crate) fn check_text(what: &'static str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(StateError::invalid(
            what,
            "it contains a NUL character, which cannot be stored; escape it",
        ));
    }
    Ok(())
}

/// JSON as stored: text, keeping key order (PostgreSQL's `jsonb` would reorder keys and change
/// what a hash over the text means).
pub(crate) fn json_text(v: &Value) -> String {
    // serde_json escapes NUL inside strings, so the text never holds a raw one.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_string())
}
