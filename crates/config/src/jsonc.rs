//! Reading configuration files: JSON, plus the comments and trailing commas that VS Code's and
//! Cursor's files (JSONC) allow. Nothing looser: a missing comma or a bare word is still an error,
//! so a typo is reported rather than guessed at.

use std::path::Path;

use jsonc_parser::ParseOptions;
use serde_json::Value;

use crate::Problem;

fn options() -> ParseOptions {
    ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// Parses JSONC text; `file` names it in the error.
pub fn parse(file: &str, text: &str) -> Result<Value, Problem> {
    // A byte-order mark is how some editors on Windows start a UTF-8 file.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = jsonc_parser::parse_to_serde_value(text, &options()).map_err(|e| {
        Problem::new(
            file,
            "",
            format!("not valid JSON: {e} (comments and trailing commas are allowed, nothing else)"),
        )
    })?;
    if value.is_null() && text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    Ok(value)
}

/// Reads and parses a file; a missing file is `None`.
pub fn read(path: &Path) -> Result<Option<Value>, Problem> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&file, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Problem::new(file, "", format!("cannot be read: {e}"))),
    }
}

/// Reads a text file (a policy); a missing file is an error naming who listed it.
pub fn read_text(path: &Path, listed_by: &str, key: &str) -> Result<String, Problem> {
    std::fs::read_to_string(path).map_err(|e| {
        Problem::new(
            listed_by,
            key,
            format!(
                "cannot read {}: {e}; fix the path (relative paths are relative to the directory of the file that lists them)",
                path.display()
            ),
        )
    })
}
