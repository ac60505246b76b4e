//! `read`: a text file with line numbers, or an image.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use codemode_spec::{
    BoxFuture, CallFacts, ContentBlock, Tool, ToolCall, ToolError, ToolOutput, ToolSpec,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, io_error, make_spec, run_blocking, text_output};

/// Lines shown when the call gives no limit.
const DEFAULT_LINE_LIMIT: usize = 2000;
/// Characters of one line shown before it is cut (minified files have enormous lines).
const MAX_LINE_CHARS: usize = 2000;
/// Largest text file read into memory; beyond this, grep or bash `sed -n` are the better tools.
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
                "Read a file. Text comes back with 1-based line numbers (like `cat -n`); at most {DEFAULT_LINE_LIMIT} lines or {} bytes per call, and a note says how to read on with `offset`. PNG, JPEG, GIF and WebP images come back as an image block {{type:\"image\", data, mimeType}}. Other binary files are refused. Relative paths are taken from the working directory.",
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
            None,
            Behaviour::ReadOnly,
        );
        ReadTool { ctx, spec }
    }
}

impl Tool for ReadTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        let args: ReadArgs = parse("read", args)?;
        let path = self.ctx.resolve(&args.path)?;
        path_facts(&path)
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let args: ReadArgs = parse("read", &call.args)?;
            let path = ctx.resolve(&args.path)?;
            let max_bytes = ctx.config.max_output_bytes;
            run_blocking(call.cancel, move |_| read_file(&path, &args, max_bytes)).await
        })
    }
}

fn read_file(path: &Path, args: &ReadArgs, max_bytes: usize) -> Result<ToolOutput, ToolError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ToolError::failed(format!(
                "file not found: {} (check the path; ls or find show what exists)",
                path.display()
            )));
        }
        Err(e) => return Err(io_error("read", path, &e)),
    };
    if meta.is_dir() {
        return Err(ToolError::invalid(format!(
            "{} is a directory, not a file; use ls to list it",
            path.display()
        )));
    }
    // Devices and FIFOs may never end (/dev/zero) or block forever; only regular files are read.
    if !meta.is_file() {
        return Err(ToolError::invalid(format!(
            "{} is not a regular file (a device, FIFO or socket); read only reads files",
            path.display()
        )));
    }
    let bytes = read_capped(path, meta.len())?;
    if let Some(mime) = image_mime(&bytes) {
        return image_output(path, &bytes, mime);
    }
    let sniff = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if sniff.contains(&0) {
        return Err(ToolError::invalid(format!(
            "{} is a binary file ({} bytes) and not an image read can show (PNG, JPEG, GIF, WebP); inspect it with bash, e.g. `file` or `xxd | head`",
            path.display(),
            bytes.len()
        )));
    }
    if bytes.is_empty() {
        // The script gets "", a person reading a direct call sees why nothing is there.
        let mut out = text_output(String::new());
        out.content = Some(vec![ContentBlock::Text {
            text: format!("({} is empty)", path.display()),
        }]);
        return Ok(out);
    }
    let text = String::from_utf8_lossy(&bytes);
    Ok(text_output(number_lines(
        &text,
        args.offset.unwrap_or(1),
        args.limit.unwrap_or(DEFAULT_LINE_LIMIT),
        max_bytes,
    )?))
}

fn read_capped(path: &Path, len: u64) -> Result<Vec<u8>, ToolError> {
    if len > MAX_TEXT_FILE_BYTES {
        return Err(ToolError::invalid(format!(
            "{} is {len} bytes, more than read takes ({MAX_TEXT_FILE_BYTES}); search it with grep or show a part with bash (`sed -n '100,200p' FILE`)",
            path.display()
        )));
    }
    // Read through `take` so a file that grows while we read cannot exceed the cap.
    let file = std::fs::File::open(path).map_err(|e| io_error("read", path, &e))?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_TEXT_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("read", path, &e))?;
    Ok(bytes)
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

fn image_output(path: &Path, bytes: &[u8], mime: &str) -> Result<ToolOutput, ToolError> {
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(ToolError::invalid(format!(
            "{} is a {} image of {} bytes, more than read returns ({MAX_IMAGE_BYTES}); shrink it first (e.g. with bash and ImageMagick)",
            path.display(),
            mime,
            bytes.len()
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
    })
}

/// Formats lines `offset..offset+limit` as `cat -n` does, stopping early at `max_bytes`, and says
/// how to read on when anything was left out.
fn number_lines(
    text: &str,
    offset: usize,
    limit: usize,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(String::new());
    }
    let lines: Vec<&str> = body.split('\n').collect();
    let total = lines.len();
    if offset == 0 || offset > total {
        return Err(ToolError::invalid(format!(
            "offset {offset} is outside the file, which has {total} lines; give an offset from 1 to {total}"
        )));
    }
    let mut out = String::new();
    let mut last = offset - 1;
    let mut hit_byte_cap = false;
    for (index, line) in lines.iter().enumerate().skip(offset - 1).take(limit) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let shown = cut_line(line);
        let formatted = format!("{:>6}\t{shown}\n", index + 1);
        if !out.is_empty() && out.len() + formatted.len() > max_bytes {
            hit_byte_cap = true;
            break;
        }
        out.push_str(&formatted);
        last = index + 1;
    }
    if last < total {
        let why = if hit_byte_cap {
            format!(" (output cap of {max_bytes} bytes reached)")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "\n[Showing lines {offset}-{last} of {total}{why}. To read on, call read with offset={}.]\n",
            last + 1
        ));
    }
    Ok(out)
}

fn cut_line(line: &str) -> std::borrow::Cow<'_, str> {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None => line.into(),
        Some((at, _)) => format!(
            "{}… [line cut: {} more characters]",
            &line[..at],
            line[at..].chars().count()
        )
        .into(),
    }
}
