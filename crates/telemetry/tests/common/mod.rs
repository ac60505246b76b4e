//! What the telemetry tests share: a tool that answers with its arguments.

use codemode_spec::{CallFacts, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use serde_json::Value;

/// Answers every call with its arguments.
pub struct Echo(pub ToolSpec);

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            Box::pin(async move { Ok(ToolOutput::value(args)) })
        }))
    }
}
