//! The `codemode` call itself, as the gate sees it: a tool whose facts are the script.

use codemode_gate::CODEMODE_TOOL;
use codemode_spec::{
    Annotations, CallFacts, Effect, Exposure, PreparedCall, ScriptFacts, Tool, ToolError, ToolSpec,
    prepared,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Registered in the gate's registry so that the `codemode` call passes the gate like any
/// other: policies can forbid it or ask for it (`resource == Tool::"codemode"`,
/// `context.script_hash`, `context.script_bytes`), hooks with matcher `codemode` see it, and the
/// audit log records it, with the script's calls naming it as their parent. Its facts are the
/// script's SHA-256 and size. [`crate::Codemode::run_script`] admits it and runs the script
/// itself, so its prepared call is never run.
pub(crate) struct CodemodeTool {
    spec: ToolSpec,
}

impl CodemodeTool {
    pub fn new() -> Self {
        let mut spec = ToolSpec::new(
            CODEMODE_TOOL,
            "Run a JavaScript script that calls tools (codemode).",
            json!({
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The JavaScript to run."}},
                "required": ["code"],
            }),
        );
        spec.exposure = Exposure::Direct;
        spec.annotations = Annotations {
            title: Some("Run a codemode script".into()),
            read_only_hint: Some(false),
            destructive_hint: Some(true),
            idempotent_hint: Some(false),
            open_world_hint: Some(true),
        };
        CodemodeTool { spec }
    }
}

/// The facts of a script: its SHA-256 (hex) and size.
pub(crate) fn script_facts(source: &str) -> ScriptFacts {
    ScriptFacts {
        sha256: hex::encode(Sha256::digest(source.as_bytes())),
        bytes: source.len() as u64,
    }
}

impl Tool for CodemodeTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let code = args.get("code").and_then(Value::as_str).ok_or_else(|| {
            ToolError::invalid("the codemode tool takes {\"code\": \"<JavaScript>\"}")
        })?;
        let facts = CallFacts {
            script: Some(script_facts(code)),
            ..CallFacts::default()
        };
        Ok(prepared(facts, |_| {
            Box::pin(async {
                Err(ToolError::failed(
                    "the codemode call runs its script through Codemode::run_script, not as a tool",
                )
                .with_effect(Effect::None))
            })
        }))
    }
}
