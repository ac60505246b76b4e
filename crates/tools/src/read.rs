//! `read`: a text file with line numbers, or an image.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use codemode_spec::{
    ContentBlock, HeldMemory, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{Resolved, SecretFiles};
use crate::held_bytes::{ByteBudget, HeldBytes};
use crate::paths::path_facts;
use crate::support::{
    Behaviour, Context, StopFlag, io_error, make_spec, run_blocking, structured_output,
};

/// Lines shown when the call gives no limit.
const DEFAULT_LINE_LIMIT: usize = 2000;
/// Characters of one line shown before it is cut (minified files have enormous lines).
const MAX_LINE_CHARS: usize = 2000;
/// Largest text file read (streamed: only the lines shown are kept); beyond this, grep or bash
/// `sed -n` are the better tools.
const MAX_TEXT_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// Largest image returned; a bigger one would swamp the model's context.
const MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;
/// Bytes inspected for a NUL byte when deciding whether a file is binary.
const BINARY_SNIFF_BYTES: usize = 8192;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

pub(crate) struct ReadTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl ReadTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "read",
            "Read file",
            &format!(
                "Read a file. Text comes back as `text` with the 1-based numbers of the lines shown (a direct call shows them numbered, like `cat -n`); at most {DEFAULT_LINE_LIMIT} lines or {} bytes per call, and `truncated` says to read on with `offset`. PNG, JPEG, GIF and WebP images come back as an image block {{type:\"image\", data, mimeType}}. Other binary files are refused. Relative paths are taken from the working directory.",
                ctx.config.max_output_bytes
            ),
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File to read, relative to the working directory or absolute."},
                    "offset": {"type": "integer", "minimum": 1, "description": "1-based line number to start at (default 1)."},
                    "limit": {"type": "integer", "minimum": 1, "description": format!("Most lines to return (default {DEFAULT_LINE_LIMIT}).")}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
            Some(json!({
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "text": {"type": "string", "description": "The lines shown, without numbers, each ending in \\n (but a last line the file does not end); a line over 2000 characters is cut with a note."},
                            "startLine": {"type": "integer", "minimum": 1, "description": "1-based number of the first line shown."},
                            "endLine": {"type": "integer", "minimum": 0, "description": "Number of the last line shown (startLine - 1 when the file is empty)."},
                            "totalLines": {"type": "integer", "minimum": 0, "description": "Lines in the whole file."},
                            "truncated": {"type": "boolean", "description": "Lines after endLine were left out; read on with offset endLine + 1."}
                        },
                        "required": ["text", "startLine", "endLine", "totalLines", "truncated"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": "image"},
                            "data": {"type": "string", "description": "base64"},
                            "mimeType": {"type": "string"}
                        },
                        "required": ["type", "data", "mimeType"],
                        "additionalProperties": false
                    }
                ]
            })),
            Behaviour::ReadOnly,
        );
        ReadTool { ctx, spec }
    }
}

impl Tool for ReadTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: ReadArgs = parse("read", args)?;
        let target = self.ctx.resolve(&args.path)?;
        let facts = path_facts(&target.path)?;
        let max_bytes = self.ctx.config.max_output_bytes;
        let tools = self.ctx.clone();
        Ok(prepared(facts, move |ctx| {
            Box::pin(run_blocking(ctx.cancel, move |stop| {
                let image_memory = &tools.image_memory;
                read_file(
                    &target,
                    &tools.secrets(),
                    &args,
                    max_bytes,
                    image_memory,
                    &stop,
                )
            }))
        }))
    }
}

fn read_file(
    target: &Resolved,
    secrets: &SecretFiles,
    args: &ReadArgs,
    max_bytes: usize,
    image_memory: &Arc<ByteBudget>,
    stop: &StopFlag,
) -> Result<ToolOutput, ToolError> {
    let path = &target.path;
    let mut file = target.open_file()?;
    secrets.refuse(&file, path)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > MAX_TEXT_FILE_BYTES {
        return Err(ToolError::invalid(format!(
            "{} is {size} bytes, more than read takes ({MAX_TEXT_FILE_BYTES}); search it with grep or show a part with bash (`sed -n '100,200p' FILE`)",
            path.display()
        )));
    }
    // Decide on the first bytes what the file is, before reading more of it.
    let mut head = Vec::with_capacity(BINARY_SNIFF_BYTES);
    (&mut file)
        .take(BINARY_SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_error("read", path, &e))?;
    if let Some(mime) = image_mime(&head) {
        let expected = size.clamp(head.len() as u64, MAX_IMAGE_BYTES + 1);
        // Its bytes while read, then their base64 twice (the value and the content block).
        let held = image_memory
            .hold(expected + expected / 3 * 8, stop)
            .ok_or_else(ToolError::cancelled)?;
        let mut bytes = head;
        (&mut file)
            .take(MAX_IMAGE_BYTES + 1 - bytes.len() as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error("read", path, &e))?;
        return image_output(path, &bytes, mime, held);
    }
    if head.contains(&0) {
        return Err(ToolError::invalid(format!(
            "{} is a binary file ({size} bytes) and not an image read can show (PNG, JPEG, GIF, WebP); inspect it with bash, e.g. `file` or `xxd | head`",
            path.display(),
        )));
    }
    if head.is_empty() {
        // A person reading a direct call sees why nothing is there.
        return Ok(structured_output(
            json!({"text": "", "startLine": 1, "endLine": 0, "totalLines": 0, "truncated": false}),
            format!("({} is empty)", path.display()),
        ));
    }
    let mut lines = Lines::new(
        args.offset.unwrap_or(1),
        args.limit.unwrap_or(DEFAULT_LINE_LIMIT),
        max_bytes,
    );
    lines.feed(&head);
    // Stream the rest: only the lines shown are kept, whatever the file's size.
    let mut rest = (&mut file).take(MAX_TEXT_FILE_BYTES);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if stop.is_set() {
            return Err(ToolError::cancelled());
        }
        let n = rest
            .read(&mut buf)
            .map_err(|e| io_error("read", path, &e))?;
        if n == 0 {
            break;
        }
        lines.feed(&buf[..n]);
    }
    lines.finish()
}

/// Keeps the lines to show while the file streams through (each cut at [`MAX_LINE_CHARS`]) and
/// counts the rest: as they are for the script, and numbered as `cat -n` does for a direct call.
struct Lines {
    offset: usize,
    limit: usize,
    max_bytes: usize,
    out: String,
    text: String,
    /// Lines completed so far.
    seen: usize,
    /// The line being read: its first bytes, and how many characters were left out.
    current: Vec<u8>,
    current_cut: usize,
    /// Whether the file ended inside a line (without a final newline).
    open: bool,
    last_shown: usize,
    byte_cap: bool,
}

impl Lines {
    fn new(offset: usize, limit: usize, max_bytes: usize) -> Self {
        Lines {
            offset,
            limit,
            max_bytes,
            out: String::new(),
            text: String::new(),
            seen: 0,
            current: Vec::new(),
            current_cut: 0,
            open: false,
            last_shown: offset.saturating_sub(1),
            byte_cap: false,
        }
    }

    fn wanted(&self, line: usize) -> bool {
        line >= self.offset && line < self.offset.saturating_add(self.limit) && !self.byte_cap
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            self.open = true;
            let end = bytes.iter().position(|b| *b == b'\n');
            let (part, rest) = match end {
                Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
                None => (bytes, None),
            };
            if self.wanted(self.seen + 1) {
                let room = (MAX_LINE_CHARS * 4 + 4).saturating_sub(self.current.len());
                let keep = part.len().min(room);
                self.current.extend_from_slice(&part[..keep]);
                self.current_cut += chars_in(&part[keep..]);
            }
            match rest {
                Some(rest) => {
                    self.end_line(true);
                    bytes = rest;
                }
                None => break,
            }
        }
    }

    /// Ends the current line; `newline` is false for a last line the file does not end.
    fn end_line(&mut self, newline: bool) {
        self.seen += 1;
        self.open = false;
        let number = self.seen;
        if !self.wanted(number) {
            return;
        }
        let mut bytes = std::mem::take(&mut self.current);
        let cut_before = std::mem::take(&mut self.current_cut);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        let text = String::from_utf8_lossy(&bytes);
        let shown = cut_line(&text, cut_before);
        let formatted = format!("{number:>6}\t{shown}\n");
        if !self.out.is_empty() && self.out.len() + formatted.len() > self.max_bytes {
            self.byte_cap = true;
            return;
        }
        self.out.push_str(&formatted);
        self.text.push_str(&shown);
        if newline {
            self.text.push('\n');
        }
        self.last_shown = number;
    }

    fn finish(mut self) -> Result<ToolOutput, ToolError> {
        if self.open {
            self.end_line(false);
        }
        let total = self.seen;
        let (offset, last) = (self.offset, self.last_shown);
        if offset == 0 || offset > total {
            return Err(ToolError::invalid(format!(
                "offset {offset} is outside the file, which has {total} lines; give an offset from 1 to {total}"
            )));
        }
        if last < total {
            let why = if self.byte_cap {
                format!(" (output cap of {} bytes reached)", self.max_bytes)
            } else {
                String::new()
            };
            self.out.push_str(&format!(
                "\n[Showing lines {offset}-{last} of {total}{why}. To read on, call read with offset={}.]\n",
                last + 1
            ));
        }
        let value = json!({
            "text": self.text,
            "startLine": offset,
            "endLine": last,
            "totalLines": total,
            "truncated": last < total,
        });
        Ok(structured_output(value, self.out))
    }
}

/// Characters in UTF-8 bytes (bytes that do not continue a character).
fn chars_in(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| (**b & 0xc0) != 0x80).count()
}

/// Recognises the image formats a model can see, by their magic bytes rather than the name.
fn image_mime(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The image as a result, holding `held` until the result is dropped (its base64 lives as long).
fn image_output(
    path: &Path,
    bytes: &[u8],
    mime: &str,
    held: HeldBytes,
) -> Result<ToolOutput, ToolError> {
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(ToolError::invalid(format!(
            "{} is a {mime} image of more than {MAX_IMAGE_BYTES} bytes, more than read returns; shrink it first (e.g. with bash and ImageMagick)",
            path.display(),
        )));
    }
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(ToolOutput {
        value: json!({"type": "image", "data": data, "mimeType": mime}),
        content: Some(vec![ContentBlock::Image {
            data,
            mime_type: mime.to_owned(),
        }]),
        is_error: false,
        usage: None,
        held: HeldMemory::new(held),
    })
}

/// A line as shown: at most [`MAX_LINE_CHARS`] characters, with how many more there were.
fn cut_line(line: &str, cut_before: usize) -> std::borrow::Cow<'_, str> {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None if cut_before == 0 => line.into(),
        None => format!("{line}… [line cut: {cut_before} more characters]").into(),
        Some((at, _)) => format!(
            "{}… [line cut: {} more characters]",
            &line[..at],
            line[at..].chars().count() + cut_before
        )
        .into(),
    }
}
