//! Token benchmark: what the same tools cost the model declared directly as JSON, as our codemode
//! description, and as the reference's codemode description.
//!
//! cargo run --release -p codemode-declarations --example token_table
//!
//! The reference column needs `npm install --prefix crates/declarations/bench-ref` (or
//! `PI_REF_DIR` pointing at a folder where `@earendil-works/pi-coding-agent@1.6.0` is installed);
//! without it the column says n/a. Set `TOKEN_TABLE_DUMP=<dir>` to write every text compared.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use codemode_declarations::{
    DEFAULT_INLINE_BUDGET_TOKENS, DescriptionInput, Encoding, RenderOptions, codemode_description,
    count_tokens, direct_definitions_json, render_declaration,
};
use codemode_spec::{CodemodeMode, NamespaceSpec, ToolSpec};
use serde_json::json;

struct Row {
    label: String,
    tools: Vec<ToolSpec>,
    namespaces: Vec<NamespaceSpec>,
    budget: usize,
}

fn main() {
    let mut rows = vec![
        Row {
            label: "no tools (API text only)".into(),
            tools: Vec::new(),
            namespaces: Vec::new(),
            budget: DEFAULT_INLINE_BUDGET_TOKENS,
        },
        Row {
            label: "coding tools (7)".into(),
            tools: support::coding_tools(),
            namespaces: Vec::new(),
            budget: DEFAULT_INLINE_BUDGET_TOKENS,
        },
    ];
    for server in ["server-everything", "server-filesystem", "server-memory"] {
        let (tools, ns) = support::mcp_server(server);
        rows.push(Row {
            label: format!("{server} ({})", tools.len()),
            tools,
            namespaces: vec![ns],
            budget: DEFAULT_INLINE_BUDGET_TOKENS,
        });
    }
    for budget in [usize::MAX, 3000] {
        let (tools, namespaces) = support::all_mcp();
        let shown = if budget == usize::MAX {
            "none".to_string()
        } else {
            budget.to_string()
        };
        rows.push(Row {
            label: format!("3 MCP servers ({}), budget {shown}", tools.len()),
            tools,
            namespaces,
            budget,
        });
    }
    // usize::MAX: no budget, every tool listed on both sides (same information, a clean ratio).
    for budget in [usize::MAX, 3000, 1000] {
        let (tools, namespaces) = support::catalog(20);
        let shown = if budget == usize::MAX {
            "none".to_string()
        } else {
            budget.to_string()
        };
        rows.push(Row {
            label: format!("catalog 500/25ns, budget {shown}"),
            tools,
            namespaces,
            budget,
        });
    }

    // The set of the model-as-user test as codemode registers it: MCP tools resolve to the whole
    // MCP result (`McpResult<S>` here; the reference's MCP adapter wraps them the same way).
    let (tools, namespaces) = support::coding_and_mcp_as_client();
    rows.push(Row {
        label: format!(
            "coding + 3 MCP servers as registered ({}), budget {DEFAULT_INLINE_BUDGET_TOKENS}",
            tools.len()
        ),
        tools,
        namespaces,
        budget: DEFAULT_INLINE_BUDGET_TOKENS,
    });

    let dump = std::env::var("TOKEN_TABLE_DUMP").ok();
    println!(
        "| tool set | direct JSON o200k / cl100k | ours o200k / cl100k (listed) | reference o200k / cl100k (listed) | ours / reference (o200k) |"
    );
    println!("|---|---|---|---|---|");
    for row in &rows {
        let direct = direct_definitions_json(&row.tools);
        let input = DescriptionInput {
            mode: CodemodeMode::Only,
            inline_budget_tokens: row.budget,
            ..DescriptionInput::new(&row.tools, &row.namespaces)
        };
        let ours = codemode_description(&input);
        let reference = reference_description(row);
        if let Some(dir) = &dump {
            let slug: String = row
                .label
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(format!("{dir}/{slug}.ours.txt"), &ours);
            if let Some(r) = &reference {
                let _ = std::fs::write(format!("{dir}/{slug}.reference.txt"), r);
            }
        }
        let count = |t: &str| {
            (
                count_tokens(t, Encoding::O200kBase),
                count_tokens(t, Encoding::Cl100kBase),
            )
        };
        let (d_o, d_c) = count(&direct);
        let (o_o, o_c) = count(&ours);
        let (ref_cell, ratio) = match &reference {
            Some(r) => {
                let (r_o, r_c) = count(r);
                let listed = r.lines().filter(|l| l.starts_with("### `")).count();
                (
                    format!("{r_o} / {r_c} ({listed})"),
                    format!("{:.2}x", o_o as f64 / r_o as f64),
                )
            }
            None => ("n/a".to_string(), "n/a".to_string()),
        };
        let listed = ours
            .lines()
            .filter(|l| l.contains("(args: ") && !l.starts_with("//") && !l.starts_with("  "))
            .count();
        println!(
            "| {} | {d_o} / {d_c} | {o_o} / {o_c} ({listed}) | {ref_cell} | {ratio} |",
            row.label
        );
    }

    let (tools, namespaces) = support::catalog(20);
    let opts = RenderOptions::default();
    let start = Instant::now();
    let mut chars = 0;
    for tool in &tools {
        chars += render_declaration(tool, &opts).len();
    }
    let render = start.elapsed();
    let _ = count_tokens("warm up", Encoding::O200kBase);
    let start = Instant::now();
    let description = codemode_description(&DescriptionInput::new(&tools, &namespaces));
    let describe = start.elapsed();
    println!();
    println!(
        "rendering 500 declarations: {:.1} ms ({chars} chars); whole 500-tool description incl. token counting: {:.1} ms ({} chars)",
        render.as_secs_f64() * 1e3,
        describe.as_secs_f64() * 1e3,
        description.len()
    );
}

/// The reference's description through Node, or `None` when Node or the package is missing.
fn reference_description(row: &Row) -> Option<String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench-ref/reference-description.mjs"
    );
    let budget = if row.budget == usize::MAX {
        None
    } else {
        Some(row.budget)
    };
    let input = json!({"tools": row.tools, "namespaces": row.namespaces, "inlineBudget": budget});
    let mut child = Command::new("node")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()?
        .write_all(input.to_string().as_bytes())
        .ok()?;
    let output = child.wait_with_output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8(output.stdout).ok()
}
