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

/// The largest configuration file read (settings, mcp.json, models.json, a policy file).
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// Reads a configuration file that may come from an untrusted project: a regular file of at
/// most [`MAX_CONFIG_BYTES`]. A symlink to `/dev/zero` or a FIFO (which git can ship) would
/// otherwise grow the host without bound or block start-up.
fn read_config(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so that opening a FIFO with no writer does not wait forever.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(
            "it is not a regular file (a device, FIFO or directory); point the setting at a file",
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!(
            "it is larger than {} MiB, more than any configuration file needs",
            MAX_CONFIG_BYTES / (1024 * 1024)
        )));
    }
    Ok(text)
}

/// Reads and parses a file; a missing file is `None`.
pub fn read(path: &Path) -> Result<Option<Value>, Problem> {
    let file = path.display().to_string();
    match read_config(path) {
        Ok(text) => parse(&file, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Problem::new(file, "", format!("cannot be read: {e}"))),
    }
}

/// Reads a text file (a policy); a missing file is an error naming who listed it.
pub fn read_text(path: &Path, listed_by: &str, key: &str) -> Result<String, Problem> {
    read_config(path).map_err(|e| {
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

#[cfg(test)]
mod file_tests {
    use super::*;

    /// A project can ship any of these as its `.codemode/settings.json` or name them as a
    /// policy: each is refused at once, with what was wrong, instead of exhausting memory or
    /// blocking.
    #[test]
    fn devices_fifos_and_huge_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let zero = dir.path().join("settings.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let err = read(&zero).expect_err("/dev/zero");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.display().to_string()).expect("path");
        // SAFETY: mkfifo only creates a file at the given path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read(&fifo).expect_err("fifo");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let huge = dir.path().join("huge.cedar");
        let f = std::fs::File::create(&huge).expect("create");
        f.set_len(MAX_CONFIG_BYTES + 1).expect("set_len");
        let err = read_text(&huge, "settings.json", "policy[0]").expect_err("huge");
        assert!(err.to_string().contains("larger than 4 MiB"), "{err}");
        let fine = dir.path().join("fine.json");
        std::fs::write(&fine, "{\"a\": 1}").expect("write");
        assert!(read(&fine).expect("fine").is_some());
    }
}
