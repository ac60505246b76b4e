//! Tool sets shared by the tests and the `token_table` example: the built-in coding tools, the real
//! `tools/list` of three npm MCP servers, and a generated 500-tool catalog.
#![allow(dead_code)]

use codemode_spec::{Exposure, NamespaceSpec, ToolSpec};
use serde_json::{Value, json};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
pub const TESTBED_MODULES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");

/// read, write, edit, ls, find, grep, bash, as a coding agent declares them.
pub fn coding_tools() -> Vec<ToolSpec> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/coding-tools.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// One captured MCP server (`server-everything`, `server-filesystem`, `server-memory`) as
/// namespaced tools: `mcp__<server>__<tool>` with characters outside `[A-Za-z0-9_]` made `_`.
pub fn mcp_server(server: &str) -> (Vec<ToolSpec>, NamespaceSpec) {
    let text = std::fs::read_to_string(format!("{FIXTURES}/mcp-{server}.json")).unwrap();
    let dump: Value = serde_json::from_str(&text).unwrap();
    let short = server.trim_start_matches("server-");
    let namespace = format!("mcp__{}", sanitize(short));
    let tools = dump["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            let raw = tool["name"].as_str().unwrap();
            let description = tool["description"]
                .as_str()
                .or(tool["title"].as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("MCP tool {raw} from server {short}"));
            let mut spec = ToolSpec::new(
                format!("{namespace}__{}", sanitize(raw)),
                description,
                tool["inputSchema"].clone(),
            );
            spec.output_schema = tool.get("outputSchema").cloned();
            spec.namespace = Some(namespace.clone());
            spec
        })
        .collect();
    let ns = NamespaceSpec {
        name: namespace,
        description: Some(format!("The {short} MCP server")),
        instructions: None,
    };
    (tools, ns)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Every captured MCP server together.
pub fn all_mcp() -> (Vec<ToolSpec>, Vec<NamespaceSpec>) {
    let mut tools = Vec::new();
    let mut namespaces = Vec::new();
    for server in ["server-everything", "server-filesystem", "server-memory"] {
        let (t, ns) = mcp_server(server);
        tools.extend(t);
        namespaces.push(ns);
    }
    (tools, namespaces)
}

const AREAS: [&str; 25] = [
    "billing",
    "crm",
    "calendar",
    "mail",
    "tickets",
    "wiki",
    "storage",
    "search",
    "analytics",
    "deploy",
    "metrics",
    "logs",
    "alerts",
    "users",
    "payments",
    "inventory",
    "shipping",
    "hr",
    "chat",
    "docs",
    "forms",
    "surveys",
    "builds",
    "secrets",
    "dns",
];
const VERBS: [&str; 10] = [
    "list", "get", "create", "update", "delete", "search", "archive", "export", "restore", "count",
];
const NOUNS: [&str; 6] = ["item", "record", "report", "comment", "attachment", "label"];

/// A deterministic catalog of `per_namespace * 25` tools in 25 namespaces, with realistic
/// descriptions and 2–5 parameters (enums, bounded integers, arrays, nested objects).
pub fn catalog(per_namespace: usize) -> (Vec<ToolSpec>, Vec<NamespaceSpec>) {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut tools = Vec::new();
    let mut namespaces = Vec::new();
    for area in AREAS {
        let ns = format!("mcp__{area}");
        namespaces.push(NamespaceSpec {
            name: ns.clone(),
            description: Some(format!(
                "The {area} service: manage {area} data through its API"
            )),
            instructions: None,
        });
        for i in 0..per_namespace {
            let verb = VERBS[i % VERBS.len()];
            let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()];
            let suffix = if i >= VERBS.len() * NOUNS.len() {
                format!("_{i}")
            } else {
                String::new()
            };
            let name = format!("{ns}__{verb}_{noun}{suffix}");
            let mut properties = serde_json::Map::new();
            properties.insert(
                "id".into(),
                json!({"type": "string", "description": format!("The {noun} id in {area}")}),
            );
            let extra = 1 + (next() % 4) as usize;
            for p in 0..extra {
                let (key, schema) = match (next() % 5, p) {
                    (0, _) => (
                        "limit",
                        json!({"type": "integer", "minimum": 1, "maximum": 100, "description": "Most results to return"}),
                    ),
                    (1, _) => (
                        "status",
                        json!({"type": "string", "enum": ["open", "closed", "pending"], "description": format!("Only {noun}s with this status")}),
                    ),
                    (2, _) => (
                        "tags",
                        json!({"type": "array", "items": {"type": "string"}, "description": "Labels to match"}),
                    ),
                    (3, _) => (
                        "since",
                        json!({"type": "string", "format": "date-time", "description": "Only changes after this time"}),
                    ),
                    _ => (
                        "fields",
                        json!({"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}}, "description": format!("The {noun}'s fields to {verb}")}),
                    ),
                };
                properties.insert(key.into(), schema);
            }
            let mut spec = ToolSpec::new(
                name,
                format!(
                    "{} {area} {noun}s. Use it to {verb} {noun}s in the {area} service; the result is JSON text.",
                    capitalize(verb)
                ),
                json!({"type": "object", "properties": properties, "required": ["id"]}),
            );
            spec.namespace = Some(ns.clone());
            spec.exposure = Exposure::Codemode;
            tools.push(spec);
        }
    }
    (tools, namespaces)
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
