//! Asking a person.

use codemode_spec::{BoxFuture, CallKind, Provenance};
use serde::Serialize;
use serde_json::Value;

/// The question put to the approver.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRequest {
    pub tool_name: String,
    pub kind: CallKind,
    pub args: Value,
    pub paths: Vec<String>,
    pub provenance: Provenance,
    /// Why approval is needed (the `@ask` text or the hook's reason).
    pub reason: String,
    /// The policies that asked, if a policy did.
    pub policy_ids: Vec<String>,
}

impl ApprovalRequest {
    /// The arguments as a person must see them to approve them: whole (a cut after N
    /// characters let padding hide the end of a command), as JSON (which escapes the C0
    /// controls), with the controls JSON leaves alone escaped too (DEL, the C1 range, where a
    /// lone U+009B starts a terminal escape, and the bidirectional marks, overrides and
    /// isolates that reorder text), and runs of 32 or more spaces or tabs shown as a count, so
    /// padding cannot push the end out of sight either.
    pub fn shown_arguments(&self) -> String {
        shown_arguments(&self.args)
    }

    /// The paths the call was judged on, resolved (symlinks followed), escaped as the
    /// arguments are, one per line: `docs/notes.md` in the arguments may land in `~/.ssh`
    /// through a link the project ships, and only this says so. Empty when there are none.
    pub fn shown_paths(&self) -> String {
        shown_paths(&self.paths)
    }
}

/// Resolved paths as [`ApprovalRequest::shown_paths`] shows them, for a question asked again
/// later from a stored approval (`codemode approvals show`): the same escaping, one per line.
pub fn shown_paths(paths: &[String]) -> String {
    paths
        .iter()
        .map(|p| format!("  {}", crate::shown_text(p)))
        .collect::<Vec<_>>()
        .join("\n")
}

const LONG_RUN: usize = 32;

/// A call's arguments as a person deciding on it is shown them: compact JSON, long runs of
/// spaces or tabs counted instead of printed (padding could push the end of a command out of
/// sight), and characters that could move the cursor, recolour or reorder the terminal's text
/// escaped, so what is shown is what runs.
pub fn shown_arguments(args: &Value) -> String {
    let json = serde_json::to_string(args).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ' ' || c == '\t' {
            let mut run = 1;
            while chars.peek() == Some(&c) {
                chars.next();
                run += 1;
            }
            if run >= LONG_RUN {
                let what = if c == ' ' { "spaces" } else { "tabs" };
                out.push_str(&format!("⟨{run} {what}⟩"));
            } else {
                out.extend(std::iter::repeat_n(c, run));
            }
            continue;
        }
        push_shown(&mut out, c);
    }
    out
}

/// Text a call brings (a tool name, a hook's reason) as a person is shown it: every control
/// character but tab, and every character that reorders text, escaped.
pub fn shown_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            push_shown(&mut out, c);
        }
    }
    out
}

/// `c`, or its escape when a terminal could act on it (DEL, C1), it reorders text (every
/// `Bidi_Control` character, the Arabic letter mark U+061C included, which turns the numbers
/// after it right to left as the other marks do) or a reader may break the line there (U+2028,
/// U+2029: JSON leaves them raw, and a client's window may start a new line that reads as the
/// question's own).
fn push_shown(out: &mut String, c: char) {
    let reorders = matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    );
    let breaks = matches!(c, '\u{2028}' | '\u{2029}');
    if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) || reorders || breaks {
        out.push_str(&format!("\\u{:04x}", c as u32));
    } else {
        out.push(c);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalAnswer {
    Yes,
    No,
    /// Yes, and do not ask again for this tool in this script.
    Always,
    /// Nobody could be asked; says why, for the model (for example "this client cannot show
    /// approval requests"). The call is refused, but not as a person's "no".
    Unasked(&'static str),
}

/// Whoever answers approval questions: a terminal prompt, an MCP elicitation, a test.
///
/// The gate pauses the script's deadline clock while `approve` runs.
pub trait Approver: Send + Sync {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer>;
}

#[cfg(test)]
mod tests {
    use super::shown_arguments;
    use serde_json::json;

    #[test]
    fn long_arguments_are_shown_whole_and_padding_as_a_count() {
        let command = format!("ls{}; echo pwned > /tmp/x", " ".repeat(3000));
        let shown = shown_arguments(&json!({ "command": command }));
        assert!(
            shown.ends_with("⟨3000 spaces⟩; echo pwned > /tmp/x\"}"),
            "{shown}"
        );
        let short = shown_arguments(&json!({ "command": "a    b" }));
        assert_eq!(short, r#"{"command":"a    b"}"#);
    }

    #[test]
    fn terminal_controls_and_reordering_marks_are_escaped() {
        let shown = shown_arguments(&json!({
            "command": "rm -rf ~\u{1b}[2K\r\u{9b}2Kls\u{7f}\u{202e}txt.exe\u{2066}"
        }));
        for raw in ['\u{1b}', '\r', '\u{9b}', '\u{7f}', '\u{202e}', '\u{2066}'] {
            assert!(!shown.contains(raw), "{raw:?} in {shown}");
        }
        assert!(
            shown.contains("\\u001b[2K\\r\\u009b2Kls\\u007f\\u202etxt.exe\\u2066"),
            "{shown}"
        );
    }
}
