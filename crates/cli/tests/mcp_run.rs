//! `codemode run --mcp-config` against the real npm MCP servers of the testbed.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common;

fn testbed() -> PathBuf {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testbed/node_modules"
    ));
    assert!(
        p.join("@modelcontextprotocol/server-everything").exists(),
        "the npm testbed is missing: run scripts/test (it runs `npm ci --prefix testbed`)"
    );
    p
}

struct Env {
    work: tempfile::TempDir,
    config: tempfile::TempDir,
}

fn env() -> Env {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("hello.txt"), "hello from a file\n").unwrap();
    let config = tempfile::tempdir().unwrap();
    let tb = testbed();
    let servers = json!({ "mcpServers": {
        "everything": { "command": "node", "args": [tb.join("@modelcontextprotocol/server-everything/dist/index.js"), "stdio"] },
        "fs": { "command": "node", "args": [tb.join("@modelcontextprotocol/server-filesystem/dist/index.js"), work.path()] },
        "memory": { "command": "node", "args": [tb.join("@modelcontextprotocol/server-memory/dist/index.js")],
                    "env": { "MEMORY_FILE_PATH": work.path().join("memory.json") } }
    }});
    std::fs::write(config.path().join("mcp.json"), servers.to_string()).unwrap();
    Env { work, config }
}

fn run(env: &Env, script: &str, policy: Option<&str>) -> (Option<i32>, Value, String) {
    let mut cmd = common::codemode();
    cmd.args(["run", "--json", "--no-builtins", "--workdir"])
        .arg(env.work.path())
        .arg("--config-dir")
        .arg(env.config.path());
    if let Some(p) = policy {
        let file = env.work.path().join("policy.cedar");
        std::fs::write(&file, p).unwrap();
        cmd.arg("--policy").arg(file);
    }
    cmd.arg("-");
    common::json_outcome(common::pipe(cmd, Some(script)))
}

const PERMIT_MCP: &str = "@id(\"mcp-servers\")\npermit (principal, action == Action::\"tool_call\", resource)\nwhen { resource.namespace like \"mcp__*\" };\n";

#[test]
fn a_script_reads_through_one_server_and_stores_in_another() {
    let env = env();
    let path = env.work.path().join("hello.txt");
    let script = format!(
        r#"const file = await tools.mcp__fs__read_text_file({{ path: {path:?} }});
           const text = file.content[0].text;
           await tools.mcp__memory__create_entities({{ entities: [{{ name: "greeting", entityType: "note", observations: [text] }}] }});
           const graph = JSON.parse((await tools.mcp__memory__read_graph({{}})).content[0].text);
           const echoed = await tools.mcp__everything__echo({{ message: "hi" }});
           return {{ text, entities: graph.entities.map(e => e.name), echoed: echoed.content[0].text }}"#
    );
    let (code, v, stderr) = run(&env, &script, Some(PERMIT_MCP));
    assert_eq!(code, Some(0), "{v}\n{stderr}");
    assert_eq!(v["value"]["text"], "hello from a file\n");
    assert_eq!(v["value"]["entities"], json!(["greeting"]));
    assert!(v["value"]["echoed"].as_str().unwrap().contains("hi"), "{v}");
}

#[test]
fn the_default_policy_runs_read_only_mcp_tools_and_refuses_the_rest() {
    let env = env();
    let script = r#"const graph = await tools.mcp__memory__read_graph({});
        let write;
        try { await tools.mcp__memory__create_entities({ entities: [] }); write = "ran" } catch (e) { write = e.message }
        return { read: graph.isError === true ? "error" : "ok", write }"#;
    let (code, v, stderr) = run(&env, script, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(v["value"]["read"], "ok", "{v}");
    let msg = v["value"]["write"].as_str().unwrap_or_default();
    assert!(msg.contains("no policy permits"), "{msg}");
}

#[test]
fn a_server_whose_annotations_are_not_believed_gets_no_read_only_pass() {
    let env = env();
    let file = env.config.path().join("mcp.json");
    let mut servers: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    servers["mcpServers"]["memory"]["trustAnnotations"] = json!(false);
    std::fs::write(&file, servers.to_string()).unwrap();
    // `read_graph` says `readOnlyHint: true`; `list_allowed_directories` of a believed server too.
    let script = r#"const out = {};
        try { await tools.mcp__memory__read_graph({}); out.graph = "ran" } catch (e) { out.graph = e.message }
        const dirs = await tools.mcp__fs__list_allowed_directories({});
        out.dirs = dirs.isError === true ? "error" : "ok";
        return out"#;
    let (code, v, stderr) = run(&env, script, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(v["value"]["dirs"], "ok", "{v}");
    let msg = v["value"]["graph"].as_str().unwrap_or_default();
    assert!(msg.contains("no policy permits"), "{msg}");
    // `codemode tools` shows the same judgement, and the protocol's own resource reading stays.
    let out = common::codemode()
        .args(["tools", "--no-builtins", "--config-dir"])
        .arg(env.config.path())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("mcp__memory__read_graph ").ends_with("deny"),
        "{listing}"
    );
    assert!(
        line("mcp__memory__read_resource ").contains("allow"),
        "{listing}"
    );
    assert!(
        line("mcp__fs__list_allowed_directories ").contains("allow"),
        "{listing}"
    );
}

#[test]
fn fifty_concurrent_calls_over_the_same_servers() {
    let env = env();
    let script = r#"const rs = await Promise.all(Array.from({ length: 50 }, (_, i) =>
                      tools.mcp__everything__echo({ message: "m" + i })));
                    return rs.map(r => r.content[0].text).filter(t => t.includes("m")).length"#;
    let (code, v, stderr) = run(&env, script, Some(PERMIT_MCP));
    assert_eq!(code, Some(0), "{v}\n{stderr}");
    assert_eq!(v["value"], 50);
}

#[test]
fn serve_follows_an_upstream_tool_list_change_and_tells_the_client() {
    let config = tempfile::tempdir().unwrap();
    let tb = testbed();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mcp/tests/fixtures/misbehaving-server.cjs"
    );
    let servers = json!({ "mcpServers": { "bad": { "command": "node", "args": [fixture, tb] } } });
    std::fs::write(config.path().join("mcp.json"), servers.to_string()).unwrap();
    let policy = config.path().join("policy.cedar");
    std::fs::write(&policy, PERMIT_MCP).unwrap();
    let args = json!([
        "serve",
        "--no-builtins",
        // Without built-in tools nothing else asks for the codemode tool (autoEnableCodemode is
        // false), so the mode asks for it.
        "--mode",
        "on",
        "--config-dir",
        config.path(),
        "--state-dir",
        config.path().join("state"),
        "--policy",
        policy,
        "--workdir",
        config.path()
    ]);
    let client = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/list-changed-client.cjs"
    );
    let mut node = Command::new("node");
    node.arg(client)
        .arg(&tb)
        .arg(env!("CARGO_BIN_EXE_codemode"))
        .arg(args.to_string());
    let v = common::client_json(node);
    assert_eq!(v["added"], "added", "{v}");
    assert_eq!(
        v["notified"], true,
        "the client is told the list changed: {v}"
    );
    assert_eq!(v["extraBefore"], false, "{v}");
    assert_eq!(
        v["extraAfter"], true,
        "the codemode description lists the new tool: {v}"
    );
    assert_eq!(v["extra"], "extra works", "{v}");
}

#[test]
fn policy_check_knows_the_arguments_of_mcp_tools() {
    let env = env();
    let policy = env.work.path().join("echo.cedar");
    std::fs::write(
        &policy,
        "@id(\"no-secrets-echoed\")\nforbid (principal, action == Action::\"tool_call\", resource == Tool::\"mcp__everything__echo\")\nwhen { context.args has message && context.args.message like \"*secret*\" };\n",
    )
    .unwrap();
    let check = |with_servers: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_codemode"));
        cmd.args(["policy", "check"])
            .arg(&policy)
            .arg("--workdir")
            .arg(env.work.path());
        let config = if with_servers {
            env.config.path().to_path_buf()
        } else {
            env.work.path().join("empty")
        };
        cmd.arg("--config-dir").arg(config);
        cmd.stdin(Stdio::null()).output().unwrap()
    };
    let with = check(true);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let without = check(false);
    assert_eq!(
        without.status.code(),
        Some(1),
        "without the server, `message` is unknown"
    );
    assert!(String::from_utf8_lossy(&without.stderr).contains("does not fit the schema"));
}
