//! Tool sets shared by the tests and the `token_table` example: the built-in coding tools, the real
//! `tools/list` of three npm MCP servers, and a generated 500-tool catalog.
#![allow(dead_code)]

pub mod counting;

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
            spec.output_schema = tool.get("outputSchema").cloned().map(Into::into);
            spec.namespace = Some(namespace.clone());
            spec
        })
        .collect();
    let ns = NamespaceSpec {
        name: namespace,
        description: Some(format!("The {short} MCP server")),
        instructions: None,
        unavailable: None,
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

/// One captured MCP server as the MCP client registers it: each tool resolves to the whole MCP
/// result (`McpResult<S>`, with the tool's output schema as `S`) and keeps its annotations.
pub fn mcp_server_as_client(server: &str) -> (Vec<ToolSpec>, NamespaceSpec) {
    let text = std::fs::read_to_string(format!("{FIXTURES}/mcp-{server}.json")).unwrap();
    let dump: Value = serde_json::from_str(&text).unwrap();
    let (mut tools, ns) = mcp_server(server);
    for (tool, raw) in tools.iter_mut().zip(dump["tools"].as_array().unwrap()) {
        tool.output_schema = Some(codemode_spec::Schema::from(
            codemode_declarations::mcp_result_schema(
                tool.output_schema
                    .as_ref()
                    .map(codemode_spec::Schema::value)
                    .as_ref()
                    .and_then(Value::as_object),
            ),
        ));
        let hints = &raw["annotations"];
        tool.annotations.title = raw["title"].as_str().map(str::to_string);
        tool.annotations.read_only_hint = hints["readOnlyHint"].as_bool();
        tool.annotations.destructive_hint = hints["destructiveHint"].as_bool();
        tool.annotations.idempotent_hint = hints["idempotentHint"].as_bool();
        tool.annotations.open_world_hint = hints["openWorldHint"].as_bool();
    }
    (tools, ns)
}

/// The 43 tools of the model-as-user test: the coding tools and the three servers as the MCP
/// client registers them.
pub fn coding_and_mcp_as_client() -> (Vec<ToolSpec>, Vec<NamespaceSpec>) {
    let mut tools = coding_tools();
    let mut namespaces = Vec::new();
    for server in ["server-everything", "server-filesystem", "server-memory"] {
        let (t, ns) = mcp_server_as_client(server);
        tools.extend(t);
        namespaces.push(ns);
    }
    (tools, namespaces)
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
            unavailable: None,
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

/// Checks that brackets of every kind pair up in rendered TypeScript, ignoring string literals and
/// `//` comments. Returns what is wrong.
pub fn balanced(text: &str) -> Result<(), String> {
    let mut stack: Vec<char> = Vec::new();
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
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            closed = true;
                            break;
                        }
                        '\n' => return Err(format!("newline inside a string literal in:\n{text}")),
                        _ => {}
                    }
                }
                if !closed {
                    return Err(format!("unclosed string literal in:\n{text}"));
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
                if stack.pop() != Some(open) {
                    return Err(format!("unbalanced `{ch}` in:\n{text}"));
                }
            }
            _ => {}
        }
    }
    if stack.is_empty() {
        Ok(())
    } else {
        Err(format!("unclosed {stack:?} in:\n{text}"))
    }
}

/// A small deterministic generator (xorshift), so randomized tests replay exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const NASTY_TEXT: &[&str] = &[
    "plain words",
    "ends a comment */ here",
    "line\nbreak\r\nand\u{2028}separator",
    "bell\u{7} and nul\u{0} and esc\u{1b}",
    "```fence```",
    "emoji 🚀 and ümlaut",
    "",
    "   ",
    "quote \" and backslash \\",
    "{[(<unbalanced",
];
const KEYS: &[&str] = &[
    "a",
    "path",
    "old-name",
    "with space",
    "dot.ted",
    "🚀",
    "delete",
    "class",
    "1abc",
    "",
    "\"q\"",
    "*/",
    "a\nb",
    "$ok",
    "_",
];
const TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "null", "array", "object", "bogus",
];

/// A random value to feed the schema renderer: mostly schema-like objects, with garbage mixed in.
pub fn random_schema(rng: &mut Rng, depth: usize) -> Value {
    if depth > 5 {
        return json!({"type": rng.pick(TYPES)});
    }
    match rng.below(16) {
        0 => json!(rng.below(2) == 0),
        1 => Value::Null,
        2 => json!(rng.next() as i64),
        3 => json!(rng.pick(NASTY_TEXT)),
        4 => json!([random_schema(rng, depth + 1)]),
        5 => {
            let items: Vec<Value> = (0..rng.below(4)).map(|_| random_literal(rng)).collect();
            json!({"enum": items})
        }
        6 => json!({"const": random_literal(rng)}),
        7 | 8 => {
            let key = *rng.pick(&["anyOf", "oneOf", "allOf"]);
            let branches: Vec<Value> = (0..rng.below(4))
                .map(|_| random_schema(rng, depth + 1))
                .collect();
            json!({key: branches})
        }
        9 => {
            json!({"$ref": rng.pick(&["#", "#/$defs/a", "#/$defs/b", "#/definitions/x~1y", "#/$defs/%zz", "http://remote/x", "#/properties/a", "nonsense"])})
        }
        10 => {
            let n = rng.below(3);
            let items: Vec<Value> = (0..n).map(|_| random_schema(rng, depth + 1)).collect();
            match rng.below(3) {
                0 => json!({"type": "array", "items": random_schema(rng, depth + 1)}),
                1 => {
                    json!({"type": "array", "prefixItems": items, "items": random_schema(rng, depth + 1)})
                }
                _ => json!({"type": "array", "items": items}),
            }
        }
        11 => {
            let types: Vec<Value> = (0..rng.below(4)).map(|_| json!(rng.pick(TYPES))).collect();
            json!({"type": types, "nullable": rng.below(2) == 0})
        }
        _ => {
            let mut properties = serde_json::Map::new();
            for _ in 0..rng.below(5) {
                let mut schema = random_schema(rng, depth + 1);
                if let Value::Object(map) = &mut schema {
                    if rng.below(2) == 0 {
                        map.insert("description".into(), json!(rng.pick(NASTY_TEXT)));
                    }
                    match rng.below(6) {
                        0 => {
                            map.insert("minimum".into(), json!(rng.below(10)));
                        }
                        1 => {
                            map.insert("maxLength".into(), json!("not a number"));
                        }
                        2 => {
                            map.insert("pattern".into(), json!(rng.pick(NASTY_TEXT)));
                        }
                        3 => {
                            map.insert("default".into(), random_literal(rng));
                        }
                        4 => {
                            map.insert("exclusiveMinimum".into(), json!(true));
                        }
                        _ => {
                            map.insert("deprecated".into(), json!(true));
                        }
                    }
                }
                properties.insert(rng.pick(KEYS).to_string(), schema);
            }
            let required: Vec<Value> = KEYS
                .iter()
                .filter(|_| rng.below(3) == 0)
                .map(|k| json!(k))
                .collect();
            let mut out = json!({"type": "object", "properties": properties, "required": required});
            match rng.below(4) {
                0 => out["additionalProperties"] = random_schema(rng, depth + 1),
                1 => {
                    out["$defs"] =
                        json!({"a": random_schema(rng, depth + 1), "b": {"$ref": "#/$defs/a"}})
                }
                2 => out["patternProperties"] = json!({"^x": random_schema(rng, depth + 1)}),
                _ => {}
            }
            out
        }
    }
}

fn random_literal(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => json!(rng.pick(NASTY_TEXT)),
        1 => json!(rng.next() as i64 % 1000),
        2 => json!(1.5e300),
        3 => Value::Null,
        4 => json!({"k": [1, "two"]}),
        _ => json!(true),
    }
}

/// A tool of `namespace` with one string property, for tests of what servers write.
pub fn namespaced(name: &str, description: &str, namespace: &str) -> ToolSpec {
    let mut spec = ToolSpec::new(
        name,
        description,
        json!({"type": "object", "properties": {"table": {"type": "string", "description": "The table."}}}),
    );
    spec.namespace = Some(namespace.to_string());
    spec
}

/// A server's namespace with its own description.
pub fn server(name: &str, description: &str) -> NamespaceSpec {
    NamespaceSpec {
        name: name.into(),
        description: Some(description.into()),
        instructions: None,
        unavailable: None,
    }
}

/// The three tools of the trusted server `mcp__good` that hostile-text tests try to imitate.
pub fn good_database_tools() -> Vec<ToolSpec> {
    ["query", "schema", "tables"]
        .iter()
        .map(|t| namespaced(&format!("mcp__good__{t}"), "Ask the database.", "mcp__good"))
        .collect()
}

/// `n` characters of a dense script from the block at `from` (Egyptian hieroglyphs at
/// U+13000, cuneiform, Linear B), no sentence break: each costs a token or more.
pub fn dense(n: usize, from: u32) -> String {
    (0..n)
        .map(|i| char::from_u32(from + (i as u32 * 7) % 1_000).unwrap())
        .collect()
}

/// The listing block of a description (between the ```ts fence lines).
pub fn listing(description: &str) -> &str {
    let start = description
        .find("```ts\n")
        .map_or(description.len(), |i| i + 6);
    let end = description.rfind("\n```").unwrap_or(description.len());
    &description[start.min(end)..end]
}
