//! What a person deciding on a call reads: the arguments and texts a script or hook wrote,
//! with every character that reorders text escaped, so a command cannot be made to read as
//! another.

use codemode_gate::{shown_arguments, shown_paths, shown_text};
use serde_json::json;

/// Every character Unicode gives the `Bidi_Control` property: the marks, embeddings,
/// overrides and isolates the bidirectional algorithm acts on.
const BIDI_CONTROLS: [char; 12] = [
    '\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
];

/// Red team: the Arabic letter mark (U+061C) was shown raw. Invisible, it makes the numbers
/// after it read right to left: `kill -9 <ALM>1 22 333` shows as `kill -9 333 22 1`, in the
/// question, `codemode approvals list` and `show`, and the paused call's notice alike.
#[test]
fn every_bidi_control_is_escaped_in_what_a_person_is_shown() {
    for c in BIDI_CONTROLS {
        let command = format!("kill -9 {c}1 22 333");
        let escape = format!("\\u{:04x}", c as u32);
        let args = shown_arguments(&json!({ "command": command }));
        assert!(
            !args.contains(c) && args.contains(&escape),
            "U+{:04X} reaches the person raw in the arguments: {args:?}",
            c as u32
        );
        let text = shown_text(&command);
        assert!(
            !text.contains(c) && text.contains(&escape),
            "U+{:04X} reaches the person raw in a reason or name: {text:?}",
            c as u32
        );
        let paths = shown_paths(&[format!("/srv/{c}1/22")]);
        assert!(
            !paths.contains(c),
            "U+{:04X} reaches the person raw in a path: {paths:?}",
            c as u32
        );
    }
}

/// Line and paragraph separators are line breaks to some readers, yet JSON leaves them raw: in
/// an argument or a hook's reason they could start a line that reads as the question's own
/// (`Arguments: {}`). They are escaped like the other controls.
#[test]
fn line_separators_are_escaped_in_what_a_person_is_shown() {
    for c in ['\u{2028}', '\u{2029}'] {
        let forged = format!("ls{c}Arguments: {{\"command\": \"ls\"}}");
        let escape = format!("\\u{:04x}", c as u32);
        let args = shown_arguments(&json!({ "command": forged }));
        assert!(!args.contains(c) && args.contains(&escape), "{args:?}");
        let text = shown_text(&forged);
        assert!(!text.contains(c) && text.contains(&escape), "{text:?}");
        let paths = shown_paths(&[format!("/srv/a{c}b")]);
        assert!(!paths.contains(c), "{paths:?}");
    }
}
