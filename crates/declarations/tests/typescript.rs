//! The rendered TypeScript parses and type-checks: declarations for many schemas (fixtures, golden
//! cases, random ones) and whole description blocks go through the real compiler
//! (testbed/node_modules/typescript, `tsc --noEmit --strict`).

mod support;

use std::path::Path;
use std::process::Command;

use codemode_declarations::{
    DescriptionInput, RenderOptions, codemode_description, render_declaration,
};
use codemode_spec::{CodemodeMode, ToolSpec};
use serde_json::json;

fn tsc() -> String {
    let path = format!("{}/typescript/bin/tsc", support::TESTBED_MODULES);
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: run the test command in README / npm ci in testbed"
    );
    path
}

/// The ```ts block of a description.
fn block(description: &str) -> String {
    let start = description.find("```ts\n").expect("a listing block") + 6;
    let end = description.rfind("```").unwrap();
    description[start..end].to_string()
}

#[test]
fn rendered_declarations_type_check() {
    let tsc = tsc();
    let dir = tempfile::tempdir().unwrap();

    let mut tools: Vec<ToolSpec> = support::coding_tools();
    let (mcp, namespaces) = support::all_mcp();
    tools.extend(mcp.iter().cloned());
    let mut rng = support::Rng(0xdec1_a7e5);
    for i in 0..600 {
        let mut tool = ToolSpec::new(
            format!("random_{i}"),
            "random",
            support::random_schema(&mut rng, 0),
        );
        if i % 3 == 0 {
            tool.output_schema = Some(codemode_spec::Schema::from(support::random_schema(
                &mut rng, 0,
            )));
        }
        tools.push(tool);
    }
    let hostile = ToolSpec::new(
        "hostile",
        "ends */ a comment\nnew line\u{2028}separator ```fence``` \u{1b}[0m",
        json!({"type": "object", "properties": {"*/": {"type": "string", "description": "*/ oops"}, "a\nb": {"type": "null"}}}),
    );
    tools.push(hostile);

    let mut declarations = String::from("export {};\ndeclare const tools: {\n");
    for tool in &tools {
        declarations.push_str(&render_declaration(tool, &RenderOptions::default()));
        declarations.push('\n');
    }
    declarations.push_str("};\n");
    let mut files = vec![("declarations.d.ts".to_string(), declarations)];

    // Whole description blocks, including quoted keys for colliding identifiers.
    let mut colliding = tools.clone();
    colliding.push(ToolSpec::new(
        "my-tool",
        "Dashes",
        json!({"type": "object"}),
    ));
    colliding.push(ToolSpec::new(
        "my_tool",
        "Underscore",
        json!({"type": "object"}),
    ));
    for (i, (mode, budget)) in [
        (CodemodeMode::Only, 1_000_000),
        (CodemodeMode::On, 2000),
        (CodemodeMode::Only, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let input = DescriptionInput {
            mode,
            inline_budget_tokens: budget,
            ..DescriptionInput::new(&colliding, &namespaces)
        };
        files.push((
            format!("description{i}.d.ts"),
            format!("export {{}};\n{}", block(&codemode_description(&input))),
        ));
    }

    // MCP tools as the client registers them (`McpResult<S>`, shared shapes), with random
    // structured content, at every level of detail.
    let (mut client, client_namespaces) = support::coding_and_mcp_as_client();
    for i in 0..200 {
        let mut tool = ToolSpec::new(
            format!("mcp__random__tool_{i}"),
            "random",
            support::random_schema(&mut rng, 0),
        );
        tool.namespace = Some("mcp__random".into());
        let structured = support::random_schema(&mut rng, 0);
        tool.output_schema = Some(codemode_spec::Schema::from(
            codemode_declarations::mcp_result_schema(structured.as_object()),
        ));
        client.push(tool);
    }
    for (i, budget) in [usize::MAX, 6000, 3000, 1500].into_iter().enumerate() {
        let input = DescriptionInput {
            mode: CodemodeMode::Only,
            inline_budget_tokens: budget,
            ..DescriptionInput::new(&client, &client_namespaces)
        };
        files.push((
            format!("client{i}.d.ts"),
            format!("export {{}};\n{}", block(&codemode_description(&input))),
        ));
    }

    // Calls as a script writes them, checked against the 43-tool block: full names reach tools
    // declared under `Ns<prefix, …>` with their types; a name without its prefix is no tool.
    let (model_set, model_namespaces) = support::coding_and_mcp_as_client();
    let input = DescriptionInput {
        mode: CodemodeMode::Only,
        ..DescriptionInput::new(&model_set, &model_namespaces)
    };
    files.push((
        "calls.ts".to_string(),
        format!(
            "export {{}};\n{}\n{}",
            block(&codemode_description(&input)),
            r#"const graph = tools.mcp__memory__read_graph({});
const names: string[] = graph.structuredContent!.entities.map((e) => e.name);
const text: string = tools.mcp__filesystem__read_text_file({ path: "a" }).structuredContent!.content;
const echoed: boolean | undefined = tools.mcp__everything__echo({ message: "hi" }).isError;
const read: string = tools.read({ path: "a" });
// @ts-expect-error a tool's name without its namespace's prefix is not a tool
tools.read_graph({});
// @ts-expect-error arguments are checked through Ns
tools.mcp__memory__search_nodes({ q: "x" });
// @ts-expect-error results are typed through Ns
const wrong: number = tools.mcp__filesystem__list_directory({ path: "." }).structuredContent!.content;
export const used = [names, text, echoed, read, wrong];
"#
        ),
    ));

    let mut args = vec![
        "--noEmit".to_string(),
        "--strict".to_string(),
        "--pretty".to_string(),
        "false".to_string(),
    ];
    for (name, text) in &files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        args.push(path.display().to_string());
    }
    let output = Command::new("node")
        .arg(&tsc)
        .args(&args)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // Show the offending lines, not just the compiler's positions.
        let mut report = String::new();
        for line in stdout.lines().take(20) {
            report.push_str(line);
            report.push('\n');
            if let Some((file, rest)) = line.split_once('(') {
                let number: usize = rest.split(',').next().unwrap_or("0").parse().unwrap_or(0);
                if let Ok(text) = std::fs::read_to_string(file)
                    && let Some(source) = text.lines().nth(number.saturating_sub(1))
                {
                    report.push_str(&format!("    > {source}\n"));
                }
            }
        }
        panic!("tsc rejected the rendered declarations:\n{report}");
    }
}
