//! `edit`: replace an exact piece of text in a file.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use codemode_spec::{Effect, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{Leaf, Resolved, SecretFiles, rewrite};
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, io_error, make_spec, run_change, text_output};

/// Largest file edit reads and rewrites in memory.
const MAX_EDIT_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

pub(crate) struct EditTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl EditTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "edit",
            "Edit file",
            "Replace an exact piece of text in a file. `old_string` must match the file exactly, whitespace and indentation included, and must occur once unless `replace_all` is true. Include enough surrounding lines to make it unique. The file is rewritten atomically.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File to edit, relative to the working directory or absolute."},
                    "old_string": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put in its place."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one (default false)."}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
            Some(json!({"type": "string"})),
            Behaviour::Destructive,
        );
        EditTool { ctx, spec }
    }
}

impl Tool for EditTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: EditArgs = parse("edit", args)?;
        if args.old_string.is_empty() {
            return Err(ToolError::invalid(
                "old_string is empty; give the exact text to replace (use write to create a file)",
            ));
        }
        if args.old_string == args.new_string {
            return Err(ToolError::invalid(
                "old_string and new_string are the same, so the edit would change nothing",
            ));
        }
        let target = self.ctx.resolve(&args.path)?;
        let facts = path_facts(&target.path)?;
        let shown = self.ctx.display(&target.path);
        let tools = self.ctx.clone();
        Ok(prepared(facts, move |ctx| {
            Box::pin(run_change(ctx.cancel, move || {
                edit_file(&target, &tools.secrets(), &shown, &args)
            }))
        }))
    }
}

fn edit_file(
    target: &Resolved,
    secrets: &SecretFiles,
    shown: &str,
    args: &EditArgs,
) -> Result<ToolOutput, ToolError> {
    let path = &target.path;
    if let Leaf::Missing(_) = target.leaf {
        return Err(ToolError::failed(format!(
            "file not found: {} (use write to create a file)",
            path.display()
        ))
        .with_effect(Effect::None));
    }
    // Read, matched and replaced with no other change of the file in between.
    let Replaced { count, lines } = rewrite(target, |file| {
        secrets.refuse(&file, path)?;
        let text = read_text(file, path)?;
        replace_text(&text, path, args)
    })?;
    let plural = if count == 1 { "" } else { "s" };
    Ok(text_output(format!(
        "Edited {shown}: replaced {count} occurrence{plural} (line{plural} {}).",
        join_numbers(&lines)
    )))
}

fn read_text(file: File, path: &Path) -> Result<String, ToolError> {
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > MAX_EDIT_BYTES {
        return Err(ToolError::invalid(format!(
            "{} is {size} bytes, more than edit rewrites ({MAX_EDIT_BYTES}); change it with bash (sed) instead",
            path.display()
        )));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_EDIT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("read", path, &e).with_effect(Effect::None))?;
    String::from_utf8(bytes).map_err(|_| {
        ToolError::invalid(format!(
            "{} is not UTF-8 text, so edit cannot match text in it",
            path.display()
        ))
    })
}

/// How many occurrences an edit replaced, and the lines they were on.
struct Replaced {
    count: usize,
    lines: Vec<usize>,
}

/// The edited content, with how many occurrences were replaced and on which lines.
fn replace_text(
    text: &str,
    path: &Path,
    args: &EditArgs,
) -> Result<(Vec<u8>, Replaced), ToolError> {
    let starts: Vec<usize> = text
        .match_indices(&args.old_string)
        .map(|(at, _)| at)
        .collect();
    if starts.is_empty() {
        return Err(
            ToolError::failed(no_match_message(path, text, &args.old_string))
                .with_effect(Effect::None),
        );
    }
    let lines = lines_of(text, &starts);
    if starts.len() > 1 && !args.replace_all {
        return Err(ToolError::failed(format!(
            "old_string occurs {} times in {} (at lines {}); include more surrounding text to make it unique, or set replace_all to true to replace them all",
            starts.len(),
            path.display(),
            join_numbers(&lines)
        ))
        .with_effect(Effect::None));
    }
    // The result's size is known before it is built: a small file with many matches must not
    // grow past what edit writes (4 MiB of "a" with each replaced by 1,000 bytes is 4 GB).
    let grows = args.new_string.len().saturating_sub(args.old_string.len());
    let result =
        (text.len() as u64).saturating_add((grows as u64).saturating_mul(starts.len() as u64));
    if result > MAX_EDIT_BYTES {
        return Err(ToolError::invalid(format!(
            "replacing {} occurrences would make {} {result} bytes, more than edit writes ({MAX_EDIT_BYTES}); replace fewer, or write the file whole",
            starts.len(),
            path.display()
        ))
        .with_effect(Effect::None));
    }
    let updated = text.replace(&args.old_string, &args.new_string);
    Ok((
        updated.into_bytes(),
        Replaced {
            count: starts.len(),
            lines,
        },
    ))
}

fn no_match_message(path: &Path, text: &str, old: &str) -> String {
    let mut message = format!(
        "old_string was not found in {}. It must match exactly, including whitespace, indentation and line breaks; read the file again and copy the text as it is.",
        path.display()
    );
    if text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
        message.push_str(" The file uses CRLF (\\r\\n) line endings; old_string uses \\n only.");
    } else if occurs_ignoring_whitespace(text, old) {
        message.push_str(
            " The text does occur when whitespace is ignored, so the spaces, tabs or indentation differ.",
        );
    }
    message
}

/// Whether `old` occurs in `text` when each run of whitespace counts as one space and the ends
/// of `old` are trimmed. Streamed over `text` (Knuth-Morris-Pratt) rather than comparing squashed
/// copies: squashing a 64 MiB file of one-letter words took 832 MiB, eight such failed edits at
/// once 6.4 GB. What this holds is proportional to `old` only.
fn occurs_ignoring_whitespace(text: &str, old: &str) -> bool {
    let needle: Vec<u8> = squashed(old).collect();
    let Some(last) = needle.len().checked_sub(1) else {
        // All whitespace: trivially there once whitespace is ignored, as before.
        return true;
    };
    let fallback = longest_borders(&needle);
    let mut matched = 0;
    for byte in squashed(text) {
        while matched > 0 && needle[matched] != byte {
            matched = fallback[matched - 1];
        }
        if needle[matched] == byte {
            if matched == last {
                return true;
            }
            matched += 1;
        }
    }
    false
}

/// The bytes of `s`'s words joined by single spaces, without building the joined string. As
/// bytes, a match still starts and ends on whole characters, since UTF-8 is self-synchronizing.
fn squashed(s: &str) -> impl Iterator<Item = u8> + '_ {
    s.split_whitespace()
        .enumerate()
        .flat_map(|(i, word)| (i > 0).then_some(b' ').into_iter().chain(word.bytes()))
}

/// For each prefix of `needle`, the length of the longest proper prefix of it that is also its
/// suffix: where a partial match resumes after a mismatch.
fn longest_borders(needle: &[u8]) -> Vec<usize> {
    let mut borders = vec![0; needle.len()];
    let mut k = 0;
    for i in 1..needle.len() {
        while k > 0 && needle[i] != needle[k] {
            k = borders[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        borders[i] = k;
    }
    borders
}

/// 1-based line numbers of ascending byte offsets, in one pass over the text (counting from
/// the start for each offset was quadratic: hours for millions of matches).
fn lines_of(text: &str, starts: &[usize]) -> Vec<usize> {
    let bytes = text.as_bytes();
    let (mut line, mut from) = (1, 0);
    starts
        .iter()
        .map(|&at| {
            line += bytes[from..at].iter().filter(|b| **b == b'\n').count();
            from = at;
            line
        })
        .collect()
}

/// The numbers, the first 20 of them when there are more.
fn join_numbers(numbers: &[usize]) -> String {
    const SHOWN: usize = 20;
    let mut out = numbers
        .iter()
        .take(SHOWN)
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if numbers.len() > SHOWN {
        out.push_str(&format!(" and {} more", numbers.len() - SHOWN));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the hint compared before: both sides squashed whole.
    fn squashed_copy_contains(text: &str, old: &str) -> bool {
        let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        squash(text).contains(&squash(old))
    }

    #[test]
    fn the_streamed_hint_agrees_with_squashed_copies() {
        // Needles of up to 3 characters, in every third text of up to 6, from an alphabet with
        // repeats (where a naive resume goes wrong), ASCII and multi-byte whitespace, and a
        // multi-byte letter.
        let alphabet = ['a', 'b', ' ', '\u{a0}', 'é'];
        let strings = |len: usize| {
            (0..alphabet.len().pow(len as u32)).map(move |mut n| {
                (0..len)
                    .map(|_| {
                        let c = alphabet[n % alphabet.len()];
                        n /= alphabet.len();
                        c
                    })
                    .collect::<String>()
            })
        };
        let needles: Vec<String> = (1..=3).flat_map(strings).collect();
        for text in (0..=6).flat_map(strings).step_by(3) {
            for old in &needles {
                assert_eq!(
                    occurs_ignoring_whitespace(&text, old),
                    squashed_copy_contains(&text, old),
                    "text {text:?}, old {old:?}"
                );
            }
        }
    }

    #[test]
    fn a_partial_match_resumes_where_it_can() {
        assert!(occurs_ignoring_whitespace("a a a b", "a\n\ta b"));
        assert!(occurs_ignoring_whitespace("abab  abac", "ab abac"));
        assert!(!occurs_ignoring_whitespace("abab abab", "ab abac"));
    }
}
