//! What a script run produced, serialized with the reference package's field names.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::limits::Limits;
use crate::source::ScriptOptions;

/// One item of output, in the order the script produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum OutputItem {
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        console: bool,
    },
    Image {
        data: String,
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

/// Outcome of one host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStatus {
    Ok,
    Error,
    Cancelled,
}

/// One tool call the script made (globals are not recorded, as in the reference).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// 1-based call order (shared with globals).
    pub id: u64,
    pub name: String,
    pub kind: crate::HostCallKind,
    /// Compact JSON of the arguments, cut to 200 characters.
    pub args: String,
    pub status: CallStatus,
    #[serde(rename = "durationMs")]
    pub duration_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// False for a call still out when the script ended: the script never saw its result, and
    /// `status` is what the host reports of it (it may have run to its end).
    #[serde(default = "awaited_default", skip_serializing_if = "Clone::clone")]
    pub awaited: bool,
}

fn awaited_default() -> bool {
    true
}

/// One `store()` write of a successful script. A script's writes are the last of each key, in
/// the order of those last writes: applied in order, they leave the store as the script did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StoreWrite {
    Set { key: String, value: Value },
    Delete { key: String, delete: bool },
}

/// Why a script failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// The script threw, a call it awaited failed, it stalled, or it broke an output limit.
    Script,
    /// The wall deadline or the CPU budget ran out.
    Timeout,
    /// The caller's abort token fired.
    Aborted,
    /// The sandbox itself could not run the script (setup error, broken bridge, replay divergence).
    Sandbox,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptError {
    pub kind: ErrorKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

impl ScriptError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ScriptError {
            kind,
            name: None,
            message: message.into(),
            stack: None,
        }
    }
}

/// Everything a run produced. Never a Rust error: failures are `ok: false` with `error` set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptResult {
    pub ok: bool,
    /// The returned value; `None` for `undefined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    pub output: Vec<OutputItem>,
    pub calls: Vec<CallRecord>,
    /// Reported only when the script succeeded (returned or called `exit()`).
    #[serde(rename = "storeWrites")]
    pub store_writes: Vec<StoreWrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ScriptError>,
    #[serde(rename = "wallMs")]
    pub wall_ms: f64,
    /// The options line as parsed.
    pub options: ScriptOptions,
    /// The limits the script actually ran with.
    pub limits: Limits,
}

impl ScriptResult {
    /// A failed result with no output, for failures before the script starts.
    pub fn failed(error: ScriptError, options: ScriptOptions, limits: Limits) -> Self {
        ScriptResult {
            ok: false,
            value: None,
            output: Vec::new(),
            calls: Vec::new(),
            store_writes: Vec::new(),
            error: Some(error),
            wall_ms: 0.0,
            options,
            limits,
        }
    }
}
