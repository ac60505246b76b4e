//! Text an MCP server sends about itself against the budget of the codemode description: its
//! `serverInfo.description` becomes its namespace's heading, printed whether or not its tools
//! are listed, so it must not grow the description past the budget.

use codemode_declarations::{
    DEFAULT_INLINE_BUDGET_TOKENS, DescriptionInput, Encoding, ToolIndex, codemode_description,
    count_tokens,
};
use codemode_spec::{NamespaceSpec, ToolSpec};
use serde_json::json;

fn tool(name: &str, namespace: &str) -> ToolSpec {
    let mut spec = ToolSpec::new(name, "A tool.", json!({"type": "object", "properties": {}}));
    spec.namespace = Some(namespace.to_string());
    spec
}

fn namespace(description: String) -> NamespaceSpec {
    NamespaceSpec {
        name: "mcp__big".into(),
        description: Some(description),
        instructions: None,
        unavailable: None,
    }
}

/// A one-line description of a megabyte (with and without spaces) made the description about
/// 200 000 tokens against a budget of 2 400.
#[test]
fn a_huge_server_description_stays_within_the_budget() {
    let tools = vec![tool("mcp__big__t", "mcp__big")];
    for description in ["word ".repeat(200_000), "x".repeat(1_000_000)] {
        let namespaces = [namespace(description.clone())];
        let text = codemode_description(&DescriptionInput::new(&tools, &namespaces));
        let tokens = count_tokens(&text, Encoding::O200kBase);
        // The fixed API text is well under 1 000 tokens.
        assert!(
            tokens <= DEFAULT_INLINE_BUDGET_TOKENS + 1_000,
            "{tokens} tokens, {} characters",
            text.len()
        );
        assert!(text.contains("// ## mcp__big: "), "{text}");
        // Whole where the model asks for it.
        let index = ToolIndex::new(&tools, &namespaces);
        let described = index.describe_namespace("mcp__big").unwrap();
        assert_eq!(described["description"], json!(description));
    }
}

/// Several servers, each with a description just long enough: the headings together still
/// leave the description near its budget.
#[test]
fn many_long_server_descriptions_stay_near_the_budget() {
    let mut tools = Vec::new();
    let mut namespaces = Vec::new();
    for i in 0..20 {
        let ns = format!("mcp__s{i}");
        tools.push(tool(&format!("{ns}__t"), &ns));
        namespaces.push(NamespaceSpec {
            name: ns,
            description: Some(format!("Server {i}. {}", "Many words here. ".repeat(2_000))),
            instructions: None,
            unavailable: None,
        });
    }
    let text = codemode_description(&DescriptionInput::new(&tools, &namespaces));
    let tokens = count_tokens(&text, Encoding::O200kBase);
    assert!(
        tokens <= DEFAULT_INLINE_BUDGET_TOKENS + 1_000,
        "{tokens} tokens, {} characters",
        text.len()
    );
}
