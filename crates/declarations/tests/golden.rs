//! Golden tests: the exact text for representative schemas, tools and descriptions is pinned in
//! tests/golden/. After an intended change, regenerate with `UPDATE_GOLDEN=1 cargo test -p
//! codemode-declarations --test golden` and review the diff.

mod support;

use codemode_declarations::{
    DescriptionInput, Globals, RenderOptions, SearchOptions, ToolIndex, codemode_description,
    default_inline_budget, direct_tool_note, render_declaration, render_type, tool_sample,
};
use codemode_spec::{CodemodeMode, Exposure, ToolSpec};
use serde_json::{Value, json};

fn check(name: &str, actual: &str) {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden {path}; run with UPDATE_GOLDEN=1 to create it"));
    if expected != actual {
        let _ = std::fs::write(format!("{path}.actual"), actual);
        panic!("{name} differs from its golden; the new text is in {path}.actual");
    }
}

fn type_cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "primitives in a type array",
            json!({"type": ["string", "integer", "boolean", "null"]}),
        ),
        (
            "enum and const",
            json!({"type": "object", "properties": {"mode": {"enum": ["a", "b", 3, null]}, "kind": {"const": "fixed"}}, "required": ["kind"]}),
        ),
        (
            "sorted, optional, quoted keys",
            json!({"type": "object", "properties": {"zeta": {"type": "string"}, "alpha-beta": {"type": "number"}, "with space": {"type": "boolean"}, "delete": {"type": "null"}}, "required": ["zeta"]}),
        ),
        (
            "reference's read-file example",
            json!({"type": "object", "properties": {"path": {"type": "string", "description": "File path"}, "limit": {"type": "integer", "minimum": 1, "default": 20}, "mode": {"enum": ["a", "b"]}}, "required": ["path"]}),
        ),
        (
            "pydantic optional int",
            json!({"type": "object", "properties": {"n": {"anyOf": [{"type": "integer", "maximum": 5}, {"type": "null"}], "default": null}}}),
        ),
        (
            "all tags",
            json!({"type": "object", "properties": {
            "n": {"type": "number", "minimum": 0, "exclusiveMaximum": 10, "multipleOf": 0.5},
            "s": {"type": "string", "minLength": 1, "maxLength": 80, "pattern": "^[a-z]+$", "format": "email"},
            "l": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3, "uniqueItems": true},
            "old": {"type": "string", "deprecated": true, "description": "Use new instead"}}}),
        ),
        (
            "arrays and tuples",
            json!({"type": "object", "properties": {
            "list": {"type": "array", "items": {"type": ["string", "number"]}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false},
            "open": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}},
            "old": {"type": "array", "items": [{"type": "string"}, {"type": "null"}], "additionalItems": false},
            "any": {"type": "array"}}, "required": ["list", "pair", "open", "old", "any"]}),
        ),
        (
            "unions and intersections",
            json!({"type": "object", "properties": {
            "u": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}]},
            "i": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"anyOf": [{"type": "object", "properties": {"b": {"type": "string"}}}, {"type": "object", "properties": {"c": {"type": "string"}}}]}]},
            "n": {"type": "string", "nullable": true},
            "only_constraints": {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}}}),
        ),
        (
            "maps and index signatures",
            json!({"type": "object", "properties": {
            "free": {"type": "object"},
            "typed": {"type": "object", "additionalProperties": {"type": "number"}},
            "mixed": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "number"}},
            "open": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true},
            "closed": {"type": "object", "properties": {}, "additionalProperties": false}}}),
        ),
        (
            "refs: local, recursive, remote, escaped",
            json!({
            "$defs": {"Node": {"type": "object", "description": "A tree node", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}, "a/b": {"type": "string"}},
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}, "slash": {"$ref": "#/$defs/a~1b"}, "remote": {"$ref": "https://example.com/s.json"}, "missing": {"$ref": "#/$defs/nope"}, "bad": {"$ref": "#/$defs/%zz"}}}),
        ),
        (
            "nested multi-line objects indent",
            json!({"type": "object", "properties": {"outer": {"type": "object", "description": "Outer\nspans two lines", "properties": {"inner": {"type": "object", "properties": {"leaf": {"type": "string", "description": "The leaf"}}}}}}}),
        ),
        (
            "hostile descriptions",
            json!({"type": "object", "properties": {"x": {"type": "string", "description": "ends */ a comment\u{7}, has ```fences``` and\u{2028}separators"}}}),
        ),
        (
            "non-object schemas",
            json!([true, false, 1, "string", null]),
        ),
    ]
}

#[test]
fn types_match_their_goldens() {
    let mut out = String::new();
    for (name, schema) in type_cases() {
        let rendered = if name == "non-object schemas" {
            schema
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    format!(
                        "{s} renders as {}",
                        render_type(s, &RenderOptions::default())
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            render_type(&schema, &RenderOptions::default())
        };
        support::balanced(&rendered).unwrap();
        out.push_str(&format!("=== {name}\n{rendered}\n\n"));
    }
    check("types.txt", &out);
}

#[test]
fn declarations_and_samples_match_their_goldens() {
    let mut tools = support::coding_tools();
    tools.extend(support::mcp_server("server-memory").0);
    tools.extend(support::mcp_server("server-everything").0);
    let mut out = String::new();
    for tool in &tools {
        out.push_str(&render_declaration(tool, &RenderOptions::default()));
        out.push_str("\n\n");
    }
    check("declarations.txt", &out);

    let mut samples = String::new();
    for tool in tools
        .iter()
        .filter(|t| ["read", "bash", "mcp__memory__open_nodes"].contains(&t.name.as_str()))
    {
        samples.push_str(&format!("=== {}\n{}\n\n", tool.name, tool_sample(tool)));
        samples.push_str(&format!("note: {}\n\n", direct_tool_note(tool)));
    }
    check("samples.txt", &samples);
}

#[test]
fn descriptions_match_their_goldens() {
    let mut tools: Vec<ToolSpec> = support::coding_tools();
    for tool in tools
        .iter_mut()
        .filter(|t| ["read", "bash"].contains(&t.name.as_str()))
    {
        tool.exposure = Exposure::Direct;
    }
    let (mcp, namespaces) = support::all_mcp();
    tools.extend(mcp);
    let mut lint = ToolSpec::new(
        "lint-js",
        "Lint JavaScript files.",
        json!({"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}}, "required": ["files"]}),
    );
    lint.exposure = Exposure::Codemode;
    tools.push(lint);
    let mut hidden = ToolSpec::new("secret", "never shown", json!({}));
    hidden.exposure = Exposure::Hidden;
    tools.push(hidden);

    let on = DescriptionInput::new(&tools, &namespaces);
    check("description-on.txt", &codemode_description(&on));
    let only = DescriptionInput {
        mode: CodemodeMode::Only,
        globals: Globals {
            models: true,
            models_doc: Some("docs/models.md".into()),
            cells: false,
        },
        inline_budget_tokens: 1500,
        ..DescriptionInput::new(&tools, &namespaces)
    };
    check("description-only-1500.txt", &codemode_description(&only));
    let none = DescriptionInput {
        inline_budget_tokens: 0,
        ..DescriptionInput::new(&tools, &namespaces)
    };
    check("description-budget-0.txt", &codemode_description(&none));
}

/// The 43 tools of the model-as-user test (the coding tools and the three servers as the MCP
/// client registers them), one of them deferred, in mode `only` with the default budget: the
/// script API with refusals and approvals (issue 14, item 3), `McpResult` declared once with its
/// complete blocks and `textOf` (items 4, 5), the example (5), shared shapes named once (4, 8),
/// what is not listed and how to find it, with the finders' return shapes (1, 2, 7).
#[test]
fn the_model_as_user_set_matches_its_golden() {
    let (mut tools, namespaces) = support::coding_and_mcp_as_client();
    for tool in tools
        .iter_mut()
        .filter(|t| t.name == "mcp__everything__get_tiny_image")
    {
        tool.exposure = Exposure::Deferred;
    }
    let input = DescriptionInput {
        mode: CodemodeMode::Only,
        ..DescriptionInput::new(&tools, &namespaces)
    };
    let input = DescriptionInput {
        inline_budget_tokens: default_inline_budget(&input),
        ..input
    };
    let text = codemode_description(&input);
    check("description-mcp-client.txt", &text);

    // What the golden shows, asserted so that a regenerated golden cannot quietly lose it.
    assert_eq!(text.matches("type McpResult<S = unknown> = { content: Block[]; structuredContent?: S; isError?: boolean };").count(), 1);
    assert_eq!(text.matches("type Block =").count(), 1);
    for block in [
        "{ type: \"text\"; text: string }",
        "{ type: \"image\" | \"audio\"; data: string; mimeType: string }",
        "{ type: \"resource_link\"; uri: string; name: string; mimeType?: string; description?: string }",
        "{ type: \"resource\"; resource: { uri: string; mimeType?: string; text?: string; blob?: string } }",
        "`data` and `blob` are base64",
    ] {
        assert!(text.contains(block), "{block}");
    }
    // Most filesystem tools share one result type, declared once under the namespace's name.
    assert!(text.contains("type FilesystemResult = McpResult<{ content: string }>;\n"));
    let mcp_listed =
        text.matches("): McpResult").count() + text.matches("): FilesystemResult").count();
    assert_eq!(mcp_listed, 35, "every listed MCP tool refers to McpResult");
    // A namespace's tools are declared once under their shared prefix.
    for ns in ["mcp__everything__", "mcp__filesystem__", "mcp__memory__"] {
        assert!(text.contains(&format!("& Ns<\"{ns}\", {{\n")), "{ns}");
    }
    assert!(text.contains(
        "type Ns<P extends string, T> = { [K in keyof T & string as `${P}${K}`]: T[K] };"
    ));
    assert!(text.contains(
        "`Ns<P, {…}>` declares tools named with the prefix `P`: `tools.mcp__everything__echo(args)`"
    ));
    assert!(
        !text.contains("content: { data?: string"),
        "the result type is not repeated"
    );
    assert_eq!(
        text.matches("(args: ").count(),
        42,
        "every tool but the deferred one is listed"
    );
    assert!(text.contains("type Entity = {") && text.contains("args: { entities: Entity[] }"));
    for needed in [
        "`textOf(result)` joins its text",
        "MCP tools resolve to an `McpResult`, with `isError: true` if the tool failed",
        "Refusals and failures throw an Error with a `stage`: `validate`",
        "`budget` or `execute` (the tool failed)",
        "its message says whether a person was asked and what to do next",
        "Writes, `bash` and MCP tools not marked read-only may need a person's approval",
        "`await tools.<name>(args)` gives the result type declared below",
        "Every tool is callable as `tools.<name>(args)`, listed or not",
        "search-only tools",
        "`searchTools(query, {limit = 8, namespace?})` → `{name, description}[]`",
        "with `{schema: true}` its input JSON Schema",
        "`describeNamespace(name)` → `{name, description?, instructions?, unavailable?, tools: string[]}`",
        "`ALL_TOOLS`: `{name, description}[]`",
        "an unknown name throws, naming the closest",
        "Promise.all(",
        ".map(textOf)",
    ] {
        assert!(text.contains(needed), "missing {needed:?}");
    }
}

/// No tools: only what a script can do without them.
#[test]
fn no_tools_matches_its_golden() {
    check(
        "description-none.txt",
        &codemode_description(&DescriptionInput::new(&[], &[])),
    );
}

/// 500 tools in 25 namespaces at the budget chosen for them: every namespace named with its count.
#[test]
fn a_large_catalog_matches_its_golden() {
    let (tools, namespaces) = support::catalog(20);
    let input = DescriptionInput::new(&tools, &namespaces);
    let input = DescriptionInput {
        inline_budget_tokens: default_inline_budget(&input),
        ..input
    };
    check("description-catalog-500.txt", &codemode_description(&input));
}

/// What the finders answer: ranked search, samples, input schemas, and the errors for unknown
/// names with the closest ones (item 7).
#[test]
fn discovery_answers_match_their_golden() {
    let (tools, namespaces) = support::coding_and_mcp_as_client();
    let index = ToolIndex::new(&tools, &namespaces);
    let mut out = String::new();
    let opts = SearchOptions {
        limit: 10,
        namespace: None,
    };
    for query in [
        "resource",
        "image",
        "read a file",
        "knowledge graph relations",
    ] {
        let hits: Vec<String> = index
            .search(query, &opts)
            .unwrap()
            .into_iter()
            .map(|h| h.identifier)
            .collect();
        out.push_str(&format!(
            "=== searchTools({query:?}, {{limit: 10}})\n{}\n\n",
            hits.join("\n")
        ));
    }
    out.push_str(&format!(
        "=== describeTool(\"mcp__everything__get_structured_content\")\n{}\n\n",
        index
            .describe_tool("mcp__everything__get_structured_content")
            .unwrap()
    ));
    out.push_str(&format!(
        "=== describeTool(\"mcp__memory__search_nodes\", {{schema: true}})\n{}\n\n",
        serde_json::to_string_pretty(&index.input_schema("mcp__memory__search_nodes").unwrap())
            .unwrap()
    ));
    for unknown in ["get_tiny_img", "mcp__filesystem__read_fil", "unknown"] {
        out.push_str(&format!(
            "=== describeTool({unknown:?})\n{}\n\n",
            index.describe_tool(unknown).unwrap_err()
        ));
    }
    out.push_str(&format!(
        "=== describeNamespace(\"memroy\")\n{}\n",
        index.describe_namespace("memroy").unwrap_err()
    ));
    check("discovery.txt", &out);
}
