//! Text for a person's terminal. What codemode prints can carry what a script, a file in the
//! project or an MCP server chose (results, errors, names); a terminal acts on escape
//! sequences in it (OSC 52 writes the clipboard, CSI moves the cursor and erases lines, a
//! carriage return overwrites, bidirectional overrides reorder). At a terminal such characters
//! are shown escaped; into a pipe or file the text goes byte for byte, for the programs that
//! read it.

use std::borrow::Cow;
use std::io::IsTerminal;

/// `text` for standard output: escaped when that is a terminal.
pub fn for_stdout(text: &str) -> Cow<'_, str> {
    shown_if(std::io::stdout().is_terminal(), text)
}

/// `text` for standard error: escaped when that is a terminal.
pub fn for_stderr(text: &str) -> Cow<'_, str> {
    shown_if(std::io::stderr().is_terminal(), text)
}

fn shown_if(terminal: bool, text: &str) -> Cow<'_, str> {
    if terminal {
        Cow::Owned(shown_lines(text))
    } else {
        Cow::Borrowed(text)
    }
}

/// `text` with its lines kept and everything else a terminal could act on escaped as `\uXXXX`
/// (`codemode_gate::shown_text`, line by line). JSON stays JSON: such an escape inside a
/// string means the same character.
pub fn shown_lines(text: &str) -> String {
    text.split('\n')
        .map(codemode_gate::shown_text)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::shown_lines;

    #[test]
    fn keeps_lines_and_escapes_the_rest() {
        assert_eq!(
            shown_lines("a\n\u{1b}[2K\rb\u{9b}\u{202e}\tc"),
            "a\n\\u001b[2K\\u000db\\u009b\\u202e\tc"
        );
    }
}
