//! Randomized schemas (fixed seed, thousands of cases): the renderer, the description and the
//! search index never panic and always print balanced TypeScript without stray control characters.
//! The `cargo fuzz` target in fuzz/ explores further with coverage guidance.

mod support;

use codemode_declarations::{
    DescriptionInput, RenderOptions, SearchOptions, ToolIndex, codemode_description,
    direct_tool_note, render_declaration, render_type, tool_sample,
};
use codemode_spec::{CodemodeMode, ToolSpec};

const CASES: usize = 4_000;

fn check_text(text: &str) {
    support::balanced(text).unwrap();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "control character in:\n{text:?}"
    );
}

#[test]
fn random_schemas_render_without_panics() {
    let mut rng = support::Rng(0x5eed_1234_abcd_0001);
    let mut batch: Vec<ToolSpec> = Vec::new();
    for case in 0..CASES {
        let schema = support::random_schema(&mut rng, 0);
        let tight = RenderOptions {
            max_chars: 1 + rng.below(400),
            ..RenderOptions::default()
        };
        check_text(&render_type(&schema, &RenderOptions::default()));
        check_text(&render_type(&schema, &tight));
        let mut tool = ToolSpec::new(format!("t{case}"), "fuzzed tool", schema.clone());
        if rng.below(3) == 0 {
            tool.output_schema = Some(codemode_spec::Schema::from(support::random_schema(
                &mut rng, 0,
            )));
        }
        if rng.below(4) == 0 {
            tool.namespace = Some(format!("ns{}", rng.below(5)));
        }
        check_text(&render_declaration(&tool, &RenderOptions::default()));
        let sample = tool_sample(&tool);
        let code = &sample[sample.find("```ts\n").unwrap() + 6..sample.rfind("```").unwrap()];
        check_text(code);
        assert!(direct_tool_note(&tool).starts_with("Codemode: `tools.t"));
        batch.push(tool);

        if batch.len() == 200 {
            for mode in [CodemodeMode::On, CodemodeMode::Only] {
                let input = DescriptionInput {
                    mode,
                    inline_budget_tokens: rng.below(4000),
                    ..DescriptionInput::new(&batch, &[])
                };
                let text = codemode_description(&input);
                if let (Some(start), Some(end)) = (text.find("```ts\n"), text.rfind("```")) {
                    assert!(start < end);
                    check_text(&text[start + 6..end]);
                }
            }
            let index = ToolIndex::new(&batch, &[]);
            let hits = index
                .search("fuzzed tool t7 properties", &SearchOptions::default())
                .unwrap();
            assert!(!hits.is_empty());
            batch.clear();
        }
    }
}
