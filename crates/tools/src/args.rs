//! Reading a tool's arguments into a typed struct, once.

use codemode_spec::ToolError;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Parses arguments that the gate has already checked against the schema. Parsing again keeps a
/// tool safe when it is called without the gate (in tests, or by embedding code).
pub(crate) fn parse<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| {
        ToolError::invalid(format!(
            "invalid arguments for `{tool}`: {e}; see the tool's input schema for the fields it takes"
        ))
    })
}
