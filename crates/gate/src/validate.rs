//! Argument validation against a tool's input schema: no coercion, every problem with its path.

use serde_json::Value;

/// Checks `args` against the compiled schema. The error lists each problem on its own line with
/// the JSON path of the offending value, then the arguments received, so a script can fix them.
pub(crate) fn check_args(
    tool: &str,
    validator: &Result<jsonschema::Validator, String>,
    args: &Value,
) -> Result<(), String> {
    let validator = validator
        .as_ref()
        .map_err(|e| format!("`{tool}` cannot be called: {e}. Fix the tool's definition."))?;
    let problems: Vec<String> = validator
        .iter_errors(args)
        .map(|e| {
            let path = e.instance_path().to_string();
            let path = if path.is_empty() {
                "/".to_string()
            } else {
                path
            };
            format!("  - {path}: {}", crate::preview(&e.to_string(), 200))
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let received = serde_json::to_string(args).unwrap_or_default();
    let received = crate::preview(&received, 500);
    Err(format!(
        "invalid arguments for `{tool}` ({} problem{}):\n{}\nReceived: {received}\nValues are not converted between types; pass each value with the type the schema asks for.",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        problems.join("\n")
    ))
}
