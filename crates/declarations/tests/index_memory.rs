//! What the host allocates to index a large listing for `searchTools` and to describe it (red
//! team finding F6): a server may list 5,000 tools with schemas of 10 KB each. The index shares
//! the tools' schemas (a `ToolSpec` holds them as shared text) and renders a tool's sample only
//! when it is asked for, so building it costs a fraction of what the schemas themselves take,
//! not copies of them; the description reads no tool of a namespace it cannot list. This binary
//! counts every allocation, so it holds one test only.

mod support;

use codemode_declarations::{
    DescriptionInput, LARGE_CATALOG_BUDGET_TOKENS, SearchOptions, ToolIndex, codemode_description,
    default_inline_budget,
};
use codemode_spec::{CodemodeMode, NamespaceSpec, ToolSpec};
use serde_json::{Map, Value, json};
use support::counting::{Counting, peak_during};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WORDS: [&str; 8] = [
    "account", "invoice", "region", "cluster", "project", "ticket", "bucket", "pipeline",
];

/// About 10 KB of JSON: nested properties, each with a description.
fn schema(tool: usize) -> Value {
    let mut properties = Map::new();
    for p in 0..28 {
        let word = WORDS[(tool + p) % WORDS.len()];
        properties.insert(
            format!("{word}_{p}"),
            json!({
                "type": "object",
                "description": format!("The {word} settings for field {p} of tool {tool}; see the guide for the options."),
                "properties": {
                    "id": {"type": "string", "description": format!("Identifier of the {word} to use.")},
                    "limit": {"type": "integer", "minimum": 0, "description": "At most this many entries."},
                    "mode": {"type": "string", "enum": ["fast", "safe", "full"], "description": "How it is processed."},
                },
                "required": ["id"],
            }),
        );
    }
    json!({"type": "object", "properties": properties})
}

#[test]
fn indexing_5000_large_tools_copies_no_schema() {
    let (tools, schemas_bytes) = peak_during(|| {
        (0..5_000)
            .map(|i| {
                let mut spec = ToolSpec::new(
                    format!("mcp__big__{}_tool_{i}", WORDS[i % WORDS.len()]),
                    format!("Manage the {} records of tool {i}.", WORDS[i % WORDS.len()]),
                    schema(i),
                );
                spec.namespace = Some("mcp__big".into());
                spec
            })
            .collect::<Vec<_>>()
    });
    let json_bytes: usize = tools.iter().map(|t| t.input_schema.text().len()).sum();
    assert!(json_bytes > 40 << 20, "the listing is {json_bytes} bytes");
    let namespaces = [NamespaceSpec {
        name: "mcp__big".into(),
        description: Some("A large server.".into()),
        instructions: None,
        unavailable: None,
    }];
    let (index, peak) = peak_during(|| ToolIndex::new(&tools, &namespaces));
    // The specs hold their schemas as text (`schemas_bytes` is about the JSON's size); one
    // copy of them would take as much again, parsed about ten times as much. The index reads
    // each schema once, parsed for a moment, and keeps postings and names, a small part of it.
    assert!(
        schemas_bytes < json_bytes * 2,
        "the specs took {schemas_bytes} bytes for {json_bytes} bytes of schemas"
    );
    assert!(
        peak < json_bytes / 2,
        "building the index allocated {} MB at its peak, for schemas of {} MB",
        peak >> 20,
        json_bytes >> 20
    );
    let hits = index
        .search("invoice settings", &SearchOptions::default())
        .unwrap();
    assert_eq!(hits.len(), 8);
    assert!(hits[0].description.contains("declare const tools"));
    drop(index);

    // The description: the default budget is found without rendering every tool (that took
    // several times the schemas' size and seconds; what is left is the few tools printed
    // before the namespace is known not to fit), and the namespace keeps its heading.
    let input = DescriptionInput {
        tools: &tools,
        namespaces: &namespaces,
        mode: CodemodeMode::Only,
        inline_budget_tokens: 0,
        globals: Default::default(),
    };
    let (budget, peak) = peak_during(|| default_inline_budget(&input));
    assert_eq!(budget, LARGE_CATALOG_BUDGET_TOKENS);
    let input = DescriptionInput {
        inline_budget_tokens: budget,
        ..input
    };
    let (description, described) = peak_during(|| codemode_description(&input));
    assert!(
        description.contains("mcp__big") && description.contains("5000 tools, not listed"),
        "{description}"
    );
    for (what, peak) in [("the default budget", peak), ("the description", described)] {
        assert!(
            peak < json_bytes,
            "{what} allocated {} MB at its peak, for schemas of {} MB",
            peak >> 20,
            json_bytes >> 20
        );
    }
}
