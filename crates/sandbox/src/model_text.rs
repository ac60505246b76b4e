//! The text the model reads after a script: a header, the output, the error and the calls made,
//! cut to the token budget with the whole text kept in a private file.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use codemode_spec::skeleton::reads_as;

use crate::result::{CallStatus, ErrorKind, OutputItem, ScriptResult};

/// What goes back to the model. `full_output_path` names the private (0600) file holding the
/// whole output when it had to be shortened. `images_shown` is how many of the script's images,
/// in order, fit in the budget: the caller sends those and no more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelText {
    pub text: String,
    pub full_output_path: Option<PathBuf>,
    pub images_shown: usize,
}

/// Renders `result` for the model within `max_output_tokens` (o200k tokens). Images appear as
/// a one-line label (the caller sends the image blocks themselves alongside); each costs what a
/// model charges for its size, and they may take half the budget, in order, the rest going to
/// the text.
pub fn render_model_text(result: &ScriptResult, max_output_tokens: u64) -> ModelText {
    render_model_text_with_media(result, max_output_tokens, &[])
}

/// As [`render_model_text`], with more media to send after the script's images (blocks lifted
/// out of the returned value), each given as what it costs ([`media_tokens`]). `images_shown`
/// then counts the script's images and these, in that order.
pub fn render_model_text_with_media(
    result: &ScriptResult,
    max_output_tokens: u64,
    more_media: &[u64],
) -> ModelText {
    let mut header = String::new();
    let _ = write!(
        header,
        "{}\nWall time {:.1} seconds\nOutput:\n",
        if result.ok {
            "Script completed"
        } else {
            "Script failed"
        },
        result.wall_ms / 1000.0
    );
    let (images_shown, image_tokens) = media_that_fit(result, max_output_tokens, more_media);
    let body = render_body(result, images_shown);
    let budget = usize::try_from(max_output_tokens - image_tokens).unwrap_or(usize::MAX);
    let (head, tail, total) = match crate::output_budget::fit(&body, budget) {
        crate::output_budget::Fit::Whole => {
            return ModelText {
                text: header + &body,
                full_output_path: None,
                images_shown,
            };
        }
        crate::output_budget::Fit::Cut { head, tail, total } => (head, tail, total),
    };
    let (file_line, path) = match save_full_output(&body) {
        Ok(p) => (
            format!("[Full output: {} (read with offset/limit)]", p.display()),
            Some(p),
        ),
        Err(e) => (format!("[Could not save the full output: {e}]"), None),
    };
    let text = format!(
        "{header}Warning: output truncated (about {total} tokens in all)\nTotal output lines: {}\n\n{}…{} tokens truncated…{}\n\n{file_line}",
        body.split('\n').count(),
        &body[..head],
        total.saturating_sub(budget),
        &body[tail..],
    );
    ModelText {
        text,
        full_output_path: path,
        images_shown,
    }
}

/// How many of the script's images and then `more_media` are sent within `max_output_tokens`
/// (media may take half of it, in order, up to the first that does not fit), and what they
/// cost. A caller can tell which lifted blocks were left out before it renders the text.
pub fn media_shown(result: &ScriptResult, max_output_tokens: u64, more_media: &[u64]) -> usize {
    media_that_fit(result, max_output_tokens, more_media).0
}

fn media_that_fit(
    result: &ScriptResult,
    max_output_tokens: u64,
    more_media: &[u64],
) -> (usize, u64) {
    let costs = result
        .output
        .iter()
        .filter_map(|item| match item {
            OutputItem::Image { data, .. } => Some(crate::output_budget::image_tokens(data)),
            OutputItem::Text { .. } => None,
        })
        .chain(more_media.iter().copied());
    let mut shown = 0;
    let mut tokens = 0u64;
    for cost in costs {
        if tokens.saturating_add(cost) > max_output_tokens / 2 {
            break;
        }
        tokens += cost;
        shown += 1;
    }
    (shown, tokens)
}

/// What a media block lifted out of a returned value (`{type: "image"|"audio", data, mimeType}`,
/// or `{type: "resource", resource: {blob, mimeType}}`) costs the model, in tokens, at least the
/// [`IMAGE_TOKENS_MIN`](crate::output_budget::IMAGE_TOKENS_MIN) a block's overhead takes:
/// * an image by its size where its header gives it, else as the largest image;
/// * media a client may give the model as text (a `text/*`, JSON, XML, script or unknown type) a
///   token a byte decoded: no token is shorter than a byte, and counting the real tokens of
///   megabytes the script returned would put that work on the host;
/// * other media (sound, video, a PDF, an archive) a token per four bytes decoded, what prose of
///   that size takes: what a model charges for them is not known here (a compressed PDF may
///   hold far more text), so the budget bounds the bytes sent.
pub fn media_tokens(block: &serde_json::Value) -> u64 {
    use crate::output_budget::{IMAGE_TOKENS_MIN, image_tokens};
    use serde_json::Value;
    fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
        v.get(k).and_then(Value::as_str)
    }
    let kind = str_of(block, "type");
    let (data, mime) = match kind {
        Some("image" | "audio") => (str_of(block, "data"), str_of(block, "mimeType")),
        Some("resource") => {
            let resource = block.get("resource").unwrap_or(&Value::Null);
            (str_of(resource, "blob"), str_of(resource, "mimeType"))
        }
        _ => (None, None),
    };
    let tokens = match data {
        Some(data) if kind == Some("image") => return image_tokens(data),
        Some(data) => {
            let bytes = decoded_len(data) as u64;
            if kind == Some("resource") && mime.is_none_or(may_be_read_as_text) {
                bytes
            } else {
                bytes.div_ceil(4)
            }
        }
        // Not a media block: what its JSON text would take at most.
        None => block.to_string().len() as u64,
    };
    tokens.max(IMAGE_TOKENS_MIN)
}

/// A MIME type without its parameters, in lower case (`Image/PNG; x=1` is `image/png`).
fn mime_essence(mime: &str) -> String {
    mime.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a client may put media of this MIME type into the model's context as text: anything
/// but the kinds it cannot read so (a missing or unknown type counts as text, and so does XML or
/// JSON of any kind, an SVG picture too).
fn may_be_read_as_text(mime: &str) -> bool {
    let essence = mime_essence(mime);
    if essence.ends_with("+xml") || essence.ends_with("+json") {
        return true;
    }
    let binary_kinds = ["image/", "audio/", "video/", "font/", "model/"];
    let binary_types = [
        "application/pdf",
        "application/zip",
        "application/gzip",
        "application/octet-stream",
        "application/wasm",
    ];
    !(binary_kinds.iter().any(|k| essence.starts_with(k))
        || binary_types.contains(&essence.as_str())
        || essence.starts_with("application/vnd."))
}

/// Why a media block lifted out of a returned value is not sent, or `None` when it may be: an
/// image block must hold a picture `image()` would take (PNG, JPEG, GIF or WebP) and say so in
/// its `mimeType`, since a client shows what the type says; an SVG, say, may run script.
pub fn media_refusal(block: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    if block.get("type").and_then(Value::as_str) != Some("image") {
        return None;
    }
    let mime = block.get("mimeType").and_then(Value::as_str).unwrap_or("");
    let essence = mime_essence(mime);
    if !crate::output_budget::IMAGE_TYPES.contains(&essence.as_str()) {
        let shown: String = mime.chars().take(60).collect();
        return Some(format!(
            "its mimeType is {shown:?}, and only PNG, JPEG, GIF and WebP pictures are sent (those image() takes). Convert the picture to one of them, or describe it in text"
        ));
    }
    let data = block.get("data").and_then(Value::as_str).unwrap_or("");
    if crate::output_budget::image_type(data).is_none() {
        return Some("its data is not a PNG, JPEG, GIF or WebP picture in base64, though its mimeType says so; only those are sent (the pictures image() takes)".into());
    }
    None
}

/// Lines of codemode's own framing. Script output (which may quote a file or a tool's result)
/// that starts a line with one gets a backslash, so it cannot pass for codemode's: a fake
/// "Script error", a fake timeout, a fake list of calls, a fake pointer to the full output.
const FRAMING: [&str; 19] = [
    "Script completed",
    "Script failed",
    "Script error:",
    "Script timed out",
    "Script aborted",
    "Script sandbox failed",
    "Wall time",
    "Output:",
    "Warning: output truncated",
    "Total output lines:",
    "[Full output:",
    "[Image (",
    "==> text ",
    "Tool calls made before the failure",
    "No tool calls were made.",
    // The runtime's notes after the output (media left out, model usage).
    "Note:",
    "Model usage:",
    // A cell's report (`wait`, `start`): its status lines and the head of what it printed.
    "[Cell ",
    "Output so far:",
];

/// Characters after which a reader sees a new line: a model reads text, where a carriage return,
/// a line or paragraph separator, NEL, a vertical tab or a form feed each start one as `\n` does.
const LINE_BREAKS: [char; 7] = [
    '\n', '\r', '\u{2028}', '\u{2029}', '\u{0085}', '\u{000B}', '\u{000C}',
];

// What a line reads as is judged on its skeleton, not on its characters: each character folded
// on its own to the visible ASCII it reads as, in lower case (`codemode_spec::skeleton`), and every other one
// (spaces, invisibles, fillers, blanks, combining marks, letters of other scripts that look
// like no Latin one) dropped, wherever it is. A list of invisible characters is never complete
// (Hangul fillers, braille blanks, tag characters, variation selectors, ...): what is not visible
// ASCII after the fold counts for nothing. The patterns are matched on skeletons too, loosely
// enough that a letter the fold dropped still matches, and punctuation a pattern lacks is skipped.

/// One character of a text's skeleton, and where the character it came from is in the text.
#[derive(Debug, Clone, Copy)]
struct Folded {
    /// Visible ASCII, in lower case.
    b: u8,
    /// The source character's byte range.
    at: usize,
    end: usize,
    /// Whether white space came between this and the skeleton character before it.
    gap: bool,
}

/// A framing pattern's skeleton: lower case, without spaces.
fn squeezed(pattern: &str) -> Vec<u8> {
    pattern
        .bytes()
        .filter(|b| *b != b' ')
        .map(|b| b.to_ascii_lowercase())
        .collect()
}

/// How many of a pattern's letters and digits may be missing from a skeleton that still
/// matches it: one in six, at most two (`note:` none, `tokens truncated` two).
fn drops_allowed(pattern: &[u8]) -> usize {
    (pattern.iter().filter(|b| droppable(**b)).count() / 6).min(2)
}

fn droppable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// How much of `skeleton` a loose match of `pattern` takes from its start, if it matches: the
/// same bytes in order, up to `drops` of the pattern's letters missing. A pattern's `i` also
/// takes an `l`, what UTS #39 folds `I`-like letters to.
fn loose_prefix(pattern: &[u8], skeleton: &[u8], drops: usize) -> Option<usize> {
    let Some((&p, rest)) = pattern.split_first() else {
        return Some(0);
    };
    let Some(&s) = skeleton.first() else {
        return (drops > 0 && droppable(p))
            .then(|| loose_prefix(rest, skeleton, drops - 1))
            .flatten();
    };
    if reads_as(p, s)
        && let Some(n) = loose_prefix(rest, &skeleton[1..], drops)
    {
        return Some(n + 1);
    }
    // Punctuation the pattern does not have here (`**Script error:**`, `Script.completed`,
    // `</console-output>`) hides nothing: skipped, wherever it is.
    if s != p && is_punctuation(s) {
        return loose_prefix(pattern, &skeleton[1..], drops).map(|n| n + 1);
    }
    if drops > 0 && droppable(p) {
        return loose_prefix(rest, skeleton, drops - 1);
    }
    None
}

fn is_punctuation(b: u8) -> bool {
    b.is_ascii_punctuation() && b != b'_'
}

/// The longest skeleton a pattern's match can take.
const LINE_HEAD: usize = 32;

/// The framing patterns' skeletons, with how many letters each may miss.
fn framing_skeletons() -> &'static [(Vec<u8>, usize)] {
    static SKELETONS: std::sync::OnceLock<Vec<(Vec<u8>, usize)>> = std::sync::OnceLock::new();
    SKELETONS.get_or_init(|| {
        FRAMING
            .iter()
            .map(|f| {
                let s = squeezed(f);
                debug_assert!(s.len() <= LINE_HEAD);
                let drops = drops_allowed(&s);
                (s, drops)
            })
            .collect()
    })
}

/// Whether a line whose skeleton starts with `head` would read as a framing line.
fn passes_for_framing(head: &[u8]) -> bool {
    framing_skeletons()
        .iter()
        .any(|(f, drops)| loose_prefix(f, head, *drops).is_some())
}

/// Folded characters a match may look at after its anchor, and a count's digits before it.
const AHEAD: usize = 48;
const BEHIND: usize = 32;
/// Folded characters looked at in one go.
const CHUNK: usize = 4096;

/// Where a backslash goes in `text` so that nothing in it reads as codemode's framing, in one
/// pass over it: at the start of each line whose skeleton starts with a framing line's, just
/// after the `<` of each console tag, and in front of each truncation marker's count. Only a
/// line's first skeleton characters and a bounded window of the text's are held.
fn escapes(text: &str) -> Vec<usize> {
    let mut found = Vec::new();
    // The line being read: where it starts, and its skeleton so far (`None` once judged).
    let mut line_start = 0;
    let mut head: Option<Vec<u8>> = Some(Vec::with_capacity(LINE_HEAD));
    let mut window: Vec<Folded> = Vec::with_capacity(CHUNK + AHEAD + BEHIND);
    // The first window index not yet looked at as an anchor.
    let mut next = 0;
    let mut gap = false;
    let mut folds = codemode_spec::skeleton::FoldCache::default();
    for (at, c) in text.char_indices() {
        if c.is_whitespace() {
            gap = true;
            if LINE_BREAKS.contains(&c) {
                if let Some(h) = head.take()
                    && passes_for_framing(&h)
                {
                    found.push(line_start);
                }
                line_start = at + c.len_utf8();
                head = Some(Vec::with_capacity(LINE_HEAD));
            }
            continue;
        }
        let end = at + c.len_utf8();
        folds.fold(c, &mut |b| {
            window.push(Folded { b, at, end, gap });
            gap = false;
            if let Some(h) = &mut head {
                h.push(b);
                if h.len() == LINE_HEAD {
                    if passes_for_framing(h) {
                        found.push(line_start);
                    }
                    head = None;
                }
            }
        });
        if window.len() >= CHUNK + AHEAD + BEHIND {
            let upto = window.len() - AHEAD;
            while next < upto {
                look_at(&window, next, &mut found);
                next += 1;
            }
            window.drain(..upto - BEHIND);
            next = BEHIND;
        }
    }
    if let Some(h) = head
        && passes_for_framing(&h)
    {
        found.push(line_start);
    }
    while next < window.len() {
        look_at(&window, next, &mut found);
        next += 1;
    }
    found
}

/// Looks at `window[i]` as the start of a console tag or of a truncation marker's `tokens`;
/// `window` holds [`AHEAD`] characters after `i` unless the text ends first, and [`BEHIND`]
/// before it unless the text starts there.
fn look_at(window: &[Folded], i: usize, found: &mut Vec<usize>) {
    let b = window[i].b;
    // Most characters anchor nothing: look no further, with nothing allocated.
    if !(b == b'<' || reads_as(b't', b)) {
        return;
    }
    let mut buf = [0u8; AHEAD];
    let mut n = 0;
    for f in &window[i + 1..(i + 1 + AHEAD).min(window.len())] {
        buf[n] = f.b;
        n += 1;
    }
    let ahead = &buf[..n];
    if b == b'<' {
        // `<console_output>` or `</console_output>`, however spelled past its first letters
        // (`</CONSOLE-OUTPUT >`, `</console_outputs>`, `</console_0utput>`): a model reads
        // each as the tag, so every `<` before `consol` gets a backslash.
        const NAME: &[u8] = b"consol";
        if loose_prefix(NAME, ahead, drops_allowed(NAME)).is_some() {
            found.push(window[i].end);
        }
        return;
    }
    // The marker that stands for the text cut out of long output (`…12000 tokens
    // truncated…`), in any case and with any count (`twelve thousand`, `12k`, none) or a word
    // between (`tokens were truncated`): a forged one tells the model that output it did not
    // see was cut, or hides where the real cut is. The backslash goes before the count (the
    // digits and `,._` before `tokens`, with the ellipsis in front if there is one) when it is
    // short, else before `tokens`.
    const TOKENS: &[u8] = b"okens";
    const TRUNCATED: &[u8] = b"truncated";
    let Some(after) = loose_prefix(TOKENS, ahead, 1) else {
        return;
    };
    // A word of up to a dozen letters may stand between.
    if !(after..=(after + 12).min(ahead.len()))
        .any(|k| loose_prefix(TRUNCATED, &ahead[k..], drops_allowed(TRUNCATED)).is_some())
    {
        return;
    }
    let mut first = i;
    while first > 0 && i - first < BEHIND - 1 && is_count(window[first - 1].b) {
        if window[first].gap && first != i {
            break;
        }
        first -= 1;
    }
    let whole_count = first == 0 || !is_count(window[first - 1].b) || window[first].gap;
    found.push(if whole_count {
        window[first].at
    } else {
        window[i].at
    });
}

/// What a count in a truncation marker is made of (`12000`, `1,322`), and the dots of the
/// ellipsis in front of it.
fn is_count(b: u8) -> bool {
    b.is_ascii_digit() || b",._".contains(&b)
}

/// `text` from the script, unable to close the console block, to pass for a framing line or to
/// forge the truncation marker: each gets a backslash in front. For every place that shows a
/// script's output to the model outside [`render_model_text`] (a running cell's report).
pub fn escape_script_text(text: &str) -> std::borrow::Cow<'_, str> {
    let mut escapes = escapes(text);
    if escapes.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    escapes.sort_unstable();
    escapes.dedup();
    let mut out = String::with_capacity(text.len() + escapes.len());
    let mut from = 0;
    for at in escapes {
        out.push_str(&text[from..at]);
        out.push('\\');
        from = at;
    }
    out.push_str(&text[from..]);
    std::borrow::Cow::Owned(out)
}

fn render_body(result: &ScriptResult, images_shown: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut console: Vec<&str> = Vec::new();
    let mut items: Vec<Part<'_>> = Vec::new();
    let mut images_seen = 0;
    for item in &result.output {
        match item {
            OutputItem::Text {
                text,
                console: true,
            } => console.push(text),
            OutputItem::Text { text, .. } => items.push(Part::Text(text)),
            OutputItem::Image { data, mime_type } => {
                items.push(Part::Image(
                    mime_type,
                    decoded_len(data),
                    images_seen < images_shown,
                ));
                images_seen += 1;
            }
        }
    }
    let value_text;
    if result.ok
        && let Some(v) = &result.value
    {
        value_text = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        items.push(Part::Text(&value_text));
    }
    let total = items.iter().filter(|p| matches!(p, Part::Text(_))).count();
    let mut n = 0;
    for p in items {
        match p {
            Part::Text(t) => {
                n += 1;
                let t = escape_script_text(t);
                if total > 1 {
                    parts.push(format!("==> text {n}/{total} <==\n{t}"));
                } else {
                    parts.push(t.into_owned());
                }
            }
            Part::Image(mime, bytes, true) => {
                parts.push(format!("[Image ({mime}, {})]", format_size(bytes)));
            }
            Part::Image(mime, bytes, false) => {
                parts.push(format!(
                    "[Image ({mime}, {}) not shown: the images before it took the output budget's share for images]",
                    format_size(bytes)
                ));
            }
        }
    }
    if !console.is_empty() {
        parts.push(format!(
            "<console_output>\n{}\n</console_output>",
            escape_script_text(&console.join("\n"))
        ));
    }
    if let Some(err) = result.error.as_ref().filter(|_| !result.ok) {
        // A thrown error's text is the script's (its name too: `name = "Script timed out"`);
        // the other heads are codemode's, with the message neutralized after them.
        let head = match err.kind {
            ErrorKind::Script => escape_script_text(&err.stack.clone().unwrap_or_else(|| {
                format!(
                    "{}: {}",
                    err.name.as_deref().unwrap_or("Error"),
                    err.message
                )
            }))
            .into_owned(),
            ErrorKind::Timeout => format!("Script timed out: {}", escape_script_text(&err.message)),
            ErrorKind::Aborted => format!("Script aborted: {}", escape_script_text(&err.message)),
            ErrorKind::Sandbox => format!(
                "Script sandbox failed: {}",
                escape_script_text(&err.message)
            ),
        };
        let calls = if result.calls.is_empty() {
            "No tool calls were made.".to_string()
        } else {
            let list: Vec<String> = result
                .calls
                .iter()
                .map(|c| {
                    let status = match c.status {
                        CallStatus::Ok => "ok",
                        CallStatus::Error => "error",
                        CallStatus::Cancelled => "cancelled",
                    };
                    // The script may have been waiting for it (a timeout) or not (a throw):
                    // say only what is known.
                    match (c.awaited, &c.error) {
                        (true, _) => format!("{} ({status})", c.name),
                        (false, Some(note)) => format!(
                            "{} ({status}, still running when the script ended: {note})",
                            c.name
                        ),
                        (false, None) => {
                            format!("{} ({status}, still running when the script ended)", c.name)
                        }
                    }
                })
                .collect();
            format!(
                "Tool calls made before the failure (they are not undone): {}",
                list.join(", ")
            )
        };
        parts.push(format!("Script error:\n{head}\n\n{calls}"));
    }
    join_text(&parts)
}

enum Part<'a> {
    Text(&'a str),
    /// Mime type, size, and whether it is shown.
    Image(&'a str, usize, bool),
}

/// Joins parts with a newline unless the previous part already ends with one.
fn join_text(parts: &[String]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(p);
    }
    out
}

/// Bytes encoded by clean base64 text.
fn decoded_len(b64: &str) -> usize {
    let pad = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad)
}

fn format_size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1}MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Full outputs older than this are removed when the next one is saved.
const SPILL_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);
/// At most this many full outputs are kept; the oldest go first.
const SPILL_MAX_FILES: usize = 32;

/// The directory of full outputs: one per user, readable only by them.
fn spill_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("codemode-output-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Another user may have made the directory first, or a link in its place: refuse both.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Removes full outputs past their age, and the oldest beyond the count, so that spilled output
/// never piles up in the temporary directory.
fn expire_spills(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut kept: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let is_ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("output-") && n.ends_with(".txt"));
        let Ok(modified) = e.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if !is_ours {
            continue;
        }
        if now.duration_since(modified).unwrap_or_default() > SPILL_MAX_AGE {
            let _ = std::fs::remove_file(&path);
        } else {
            kept.push((modified, path));
        }
    }
    if kept.len() >= SPILL_MAX_FILES {
        kept.sort();
        for (_, path) in &kept[..=kept.len() - SPILL_MAX_FILES] {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes the whole output to a new file only this user can read, in the per-user directory of
/// full outputs, after expiring old ones.
fn save_full_output(text: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = spill_dir()?;
    expire_spills(&dir);
    let path = dir.join(format!("output-{}.txt", random_hex()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    f.write_all(text.as_bytes())?;
    Ok(path)
}
