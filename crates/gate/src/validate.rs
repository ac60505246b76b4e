//! Argument validation against a tool's input schema: no coercion, each problem with its path.

use serde_json::Value;

/// Most problems one refusal lists.
const MAX_PROBLEMS: usize = 20;

/// Arguments with more JSON values than this get only their first problem listed.
const MANY_VALUES: usize = 10_000;

/// Whether `v` holds more than `n` values, counting no further than that.
fn more_values_than(v: &Value, n: usize) -> bool {
    fn count(v: &Value, left: &mut usize) -> bool {
        if *left == 0 {
            return true;
        }
        *left -= 1;
        match v {
            Value::Array(items) => items.iter().any(|i| count(i, left)),
            Value::Object(map) => map.values().any(|i| count(i, left)),
            _ => false,
        }
    }
    let mut left = n;
    count(v, &mut left)
}

/// Checks `args` against the compiled schema. The error lists each problem (the first
/// [`MAX_PROBLEMS`]) on its own line with the JSON path of the offending value, then the
/// arguments received, so a script can fix them.
pub(crate) fn check_args(
    tool: &str,
    validator: &Result<jsonschema::Validator, String>,
    args: &Value,
) -> Result<(), String> {
    let validator = validator
        .as_ref()
        .map_err(|e| format!("`{tool}` cannot be called: {e}. Fix the tool's definition."))?;
    if validator.is_valid(args) {
        return Ok(());
    }
    // The validator builds every error before the first is read: a million wrong items cost
    // half a GB and made a 50 MB message. Large arguments get their first problem only.
    let first_only = more_values_than(args, MANY_VALUES);
    let errors: Vec<jsonschema::ValidationError<'_>> = if first_only {
        validator.validate(args).err().into_iter().collect()
    } else {
        validator.iter_errors(args).take(MAX_PROBLEMS + 1).collect()
    };
    let mut problems: Vec<String> = errors
        .iter()
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
        // Invalid, yet no error to show: still refused.
        problems.push("  - /: the arguments do not match the tool's schema".into());
    }
    let count = if first_only {
        "the first problem; large arguments are not checked for more".to_string()
    } else if problems.len() > MAX_PROBLEMS {
        problems.truncate(MAX_PROBLEMS);
        problems.push("  - (more not shown)".into());
        format!("more than {MAX_PROBLEMS} problems; the first {MAX_PROBLEMS}")
    } else {
        let n = problems.len();
        format!("{n} problem{}", if n == 1 { "" } else { "s" })
    };
    let received = serde_json::to_string(args).unwrap_or_default();
    let received = crate::preview(&received, 500);
    Err(format!(
        "invalid arguments for `{tool}` ({count}):\n{}\nReceived: {received}\nValues are not converted between types; pass each value with the type the schema asks for.",
        problems.join("\n")
    ))
}
