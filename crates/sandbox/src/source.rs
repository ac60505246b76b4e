//! Parsing the model's input: an optional `// @options:` first line, then the script body.

use serde::{Deserialize, Serialize};

const OPTIONS_PREFIX: &str = "// @options:";
const SUPPORTED: &str =
    "the keys `max_output_tokens`, `timeout_ms` and `yield_after_ms` (all optional)";

/// Options a script may set on its first line. Both can only lower the operator's limits
/// (see [`crate::Limits::effective`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// After this long a still-running script returns its output so far and keeps running
    /// (a cell; see `codemode-runtime`). The sandbox itself ignores it; the runtime lowers it
    /// to the operator's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub yield_after_ms: Option<u64>,
}

/// The script body (the options line replaced by an empty line so line numbers still match)
/// and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSource {
    pub code: String,
    pub options: ScriptOptions,
}

/// Input rejected before anything runs. The message tells the model how to fix its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    pub message: String,
}

fn fail<T>(message: impl Into<String>) -> Result<T, SourceError> {
    Err(SourceError {
        message: message.into(),
    })
}

/// Splits `input` into options and code, checking the options strictly.
pub fn parse_source(input: &str) -> Result<ParsedSource, SourceError> {
    // A byte-order mark is not code; left in, it would hide an options line behind it and the
    // script would run with limits it did not ask for.
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    if input.trim().is_empty() {
        return fail(
            "The script is empty. Send JavaScript source, optionally starting with a line such as `// @options: {\"max_output_tokens\": 1000}`.",
        );
    }
    for (i, line) in input.split('\n').enumerate().skip(1) {
        if line
            .trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}')
            .starts_with(OPTIONS_PREFIX)
        {
            return fail(format!(
                "The // @options: line is only allowed as the first line of the input, but line {} has one. Move it to the top.",
                i + 1
            ));
        }
    }
    let first_end = input.find('\n');
    let first = &input[..first_end.unwrap_or(input.len())];
    let first = first
        .strip_suffix('\r')
        .unwrap_or(first)
        .trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    let Some(directive) = first.strip_prefix(OPTIONS_PREFIX) else {
        return Ok(ParsedSource {
            code: input.to_string(),
            options: ScriptOptions::default(),
        });
    };
    let code = match first_end {
        Some(i) => input[i..].to_string(),
        None => String::new(),
    };
    if code.trim().is_empty() {
        return fail(
            "After the // @options: line comes the script itself, but there is none. Add the JavaScript on the following lines.",
        );
    }
    let directive = directive.trim();
    let not_object = || format!("The // @options: line needs a JSON object, with {SUPPORTED}.");
    if directive.is_empty() {
        return fail(not_object());
    }
    let value: serde_json::Value = match serde_json::from_str(directive) {
        Ok(v) => v,
        Err(e) => {
            return fail(format!(
                "The // @options: line is not valid JSON ({e}); write a JSON object with {SUPPORTED}."
            ));
        }
    };
    let Some(map) = value.as_object() else {
        return fail(not_object());
    };
    let mut options = ScriptOptions::default();
    const MAX_SAFE: u64 = (1u64 << 53) - 1;
    for (key, v) in map {
        match key.as_str() {
            "max_output_tokens" => match v.as_u64().filter(|n| *n <= MAX_SAFE) {
                Some(n) => options.max_output_tokens = Some(n),
                None => {
                    return fail(
                        "In // @options:, `max_output_tokens` takes a whole number from 0 to 2^53-1",
                    );
                }
            },
            "timeout_ms" => match v.as_u64().filter(|n| (1..=2_147_483_647).contains(n)) {
                Some(n) => options.timeout_ms = Some(n),
                None => {
                    return fail(
                        "In // @options:, `timeout_ms` takes a whole number of milliseconds from 1 to 2147483647",
                    );
                }
            },
            "yield_after_ms" => match v.as_u64().filter(|n| (1..=2_147_483_647).contains(n)) {
                Some(n) => options.yield_after_ms = Some(n),
                None => {
                    return fail(
                        "In // @options:, `yield_after_ms` takes a whole number of milliseconds from 1 to 2147483647",
                    );
                }
            },
            other => {
                return fail(format!(
                    "// @options: does not know the key `{other}`; it takes only `max_output_tokens`, `timeout_ms` and `yield_after_ms`"
                ));
            }
        }
    }
    Ok(ParsedSource { code, options })
}
