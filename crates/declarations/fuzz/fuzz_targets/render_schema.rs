//! Any bytes: as a JSON schema through the renderer, the description and the index; as text through
//! the search tokenizer. Nothing may panic, and the TypeScript must stay balanced.
#![no_main]

use codemode_declarations::{
    DescriptionInput, RenderOptions, SearchOptions, ToolIndex, codemode_description,
    render_declaration, render_type, tool_sample,
};
use codemode_spec::ToolSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let schema =
        serde_json::from_slice(data).unwrap_or(serde_json::Value::String(text.to_string()));
    let rendered = render_type(&schema, &RenderOptions::default());
    assert_balanced(&rendered);
    let tool = ToolSpec::new(
        text.chars().take(40).collect::<String>(),
        text.to_string(),
        schema,
    );
    assert_balanced(&render_declaration(&tool, &RenderOptions::default()));
    let _ = tool_sample(&tool);
    let tools = [tool];
    // Token counting dominates a run; on big inputs it would starve the rest of executions.
    if data.len() <= 4096 {
        let _ = codemode_description(&DescriptionInput::new(&tools, &[]));
    }
    let index = ToolIndex::new(&tools, &[]);
    let _ = index.search(&text, &SearchOptions::default());
    let _ = index.describe_tool(&text);
    let _ = index.describe_namespace(&text);
});

/// Brackets pair up outside string literals and `//` comments.
fn assert_balanced(text: &str) {
    let mut stack = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '{' | '[' | '(' | '<' => stack.push(ch),
            '}' | ']' | ')' | '>' => {
                let open = match ch {
                    '}' => '{',
                    ']' => '[',
                    ')' => '(',
                    _ => '<',
                };
                assert_eq!(stack.pop(), Some(open), "unbalanced {ch} in {text}");
            }
            _ => {}
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?} in {text}");
}
