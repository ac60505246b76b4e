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
    let value: Value = jsonc_parser::parse_to_serde_value::<OnceEach>(text, &options())
        .map(|v| v.0)
        .map_err(|e| {
            Problem::new(
                file,
                "",
                format!(
                    "not valid JSON: {e} (comments and trailing commas are allowed, nothing else)"
                ),
            )
        })?;
    if value.is_null() && text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    Ok(value)
}

/// A JSON value in which no object names a key twice. JSON parsers keep the last of two, so
/// `{"limits": {…}, "limits": {…}}`, or the same key spelled once with `\u` escapes, would
/// drop one without a word; in settings that can drop a restriction.
struct OnceEach(Value);

impl<'de> serde::Deserialize<'de> for OnceEach {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OnceEachVisitor).map(OnceEach)
    }
}

struct OnceEachVisitor;

impl<'de> serde::de::Visitor<'de> for OnceEachVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(OnceEach(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key \"{key}\" appears twice in one object, and only one of them could apply; say it once"
                )));
            }
            let OnceEach(value) = map.next_value()?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
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

#[cfg(test)]
mod duplicate_tests {
    use super::*;

    /// Red team: `{"\u006Cimits": {…}, "limits": {…}}` was taken with the last one silently
    /// winning, which can drop a restriction from your own settings.
    #[test]
    fn a_key_named_twice_is_an_error_however_it_is_spelled() {
        for text in [
            r#"{"limits": {"timeout_ms": 1000}, "limits": {}}"#,
            r#"{"\u006Cimits": {"timeout_ms": 1000}, "limits": {}}"#,
            r#"{"a": [{"x": 1, "x": 2}]}"#,
        ] {
            let e = parse("settings.json", text).unwrap_err().to_string();
            assert!(e.contains("appears twice"), "{text}: {e}");
        }
        let v = parse(
            "s.json",
            "// c\n{\"a\": [1, 2.5, null, true, \"s\", {\"b\": {}}],}",
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": [1, 2.5, null, true, "s", {"b": {}}]})
        );
    }
}
