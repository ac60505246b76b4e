//! Any bytes: as a JSON schema through the renderer, the description and the index; as text through
//! the search tokenizer. Nothing may panic, and the TypeScript must stay balanced.
#![no_main]

use codemode_declarations::{
    DescriptionInput, RenderOptions, SearchOptions, ToolIndex, codemode_description,
    render_declaration, render_type, tool_sample,
};
use codemode_spec::ToolSpec;
use libfuzzer_sys::fuzz_target;

// The tests' bracket checker, so the fuzzer and the tests agree on what balanced means.
#[path = "../../tests/support/mod.rs"]
mod support;

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

fn assert_balanced(text: &str) {
    if let Err(problem) = support::balanced(text) {
        panic!("{problem}");
    }
}
