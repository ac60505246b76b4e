//! Proves that every way a script can cause an effect passes the gate.
//!
//! The script's surface is enumerated twice: from what the runtime says it offers
//! (`Codemode::script_surface`) and from what the JavaScript itself can see (`globalThis`, the
//! members of `tools` and `models`). Every name is either a plain ECMAScript built-in, a piece of
//! the sandbox that only writes to the script's own output, a read-only helper, or a call that
//! the gate's hooks observe with the script's provenance.

use crate::common;

use std::collections::BTreeSet;

use codemode_runtime::{READ_ONLY_GLOBALS, ScriptRequest};
use codemode_spec::Origin;
use common::*;
use sha2::{Digest, Sha256};

/// The ECMAScript language's own globals as QuickJS provides them: none can reach the host.
const ECMASCRIPT: &[&str] = &[
    "AggregateError",
    "Array",
    "ArrayBuffer",
    "AsyncDisposableStack",
    "BigInt",
    "BigInt64Array",
    "BigUint64Array",
    "Boolean",
    "DOMException",
    "DataView",
    "Date",
    "DisposableStack",
    "Error",
    "EvalError",
    "Float16Array",
    "Float32Array",
    "Float64Array",
    "Function",
    "Infinity",
    "Int16Array",
    "Int32Array",
    "Int8Array",
    "InternalError",
    "Iterator",
    "JSON",
    "Map",
    "Math",
    "NaN",
    "Number",
    "Object",
    "Promise",
    "Proxy",
    "RangeError",
    "ReferenceError",
    "Reflect",
    "RegExp",
    "Set",
    "SharedArrayBuffer",
    "String",
    "SuppressedError",
    "Symbol",
    "SyntaxError",
    "TypeError",
    "URIError",
    "Uint16Array",
    "Uint32Array",
    "Uint8Array",
    "Uint8ClampedArray",
    "WeakMap",
    "WeakSet",
    "atob",
    "btoa",
    "decodeURI",
    "decodeURIComponent",
    "encodeURI",
    "encodeURIComponent",
    "escape",
    "eval",
    "globalThis",
    "isFinite",
    "isNaN",
    "parseFloat",
    "parseInt",
    "queueMicrotask",
    "undefined",
    "unescape",
    "performance",
];

/// The sandbox's own globals: they write to the script's result or read its snapshot, never the
/// world. `tools` and `models` are the doors, checked member by member below.
const SANDBOX_LOCAL: &[&str] = &[
    "ALL_TOOLS",
    "console",
    "exit",
    "image",
    "load",
    "store",
    "text",
    "textOf",
];

async fn run(world: &World, source: &str) -> codemode_runtime::ScriptRun {
    world
        .codemode
        .run_script(ScriptRequest::new(source, "s1"))
        .await
}

#[tokio::test]
async fn the_script_sees_no_global_that_is_not_accounted_for() {
    let world = world(Options::default()).await;
    let surface = world.codemode.script_surface();
    let run = run(
        &world,
        "return { globals: Object.getOwnPropertyNames(globalThis), tools: Object.keys(tools), models: Object.keys(models) }",
    )
    .await;
    assert!(!run.is_error, "{}", run.text);
    let value = run.result.unwrap().value.unwrap();
    let top_level_doors: BTreeSet<String> = surface
        .globals
        .iter()
        .map(|g| g.split('.').next().unwrap().to_string())
        .collect();
    for name in value["globals"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let known = ECMASCRIPT.contains(&name)
            || SANDBOX_LOCAL.contains(&name)
            || name == "tools"
            || top_level_doors.contains(name);
        assert!(
            known,
            "global `{name}` is not accounted for: a way out this test does not know"
        );
    }
    // Every member of `models` is a surface global.
    for member in value["models"].as_array().unwrap() {
        let full = format!("models.{}", member.as_str().unwrap());
        assert!(
            surface.globals.contains(&full),
            "models member {full} is not on the surface"
        );
    }
    // Every member of `tools` is a surface tool, by raw name or identifier.
    for member in value["tools"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        assert!(
            surface
                .tools
                .iter()
                .any(|t| t == member || codemode_spec::to_identifier(t) == member),
            "tools.{member} is not on the surface"
        );
    }
    // Every global is either a read-only helper or gated.
    for g in &surface.globals {
        assert!(
            READ_ONLY_GLOBALS.contains(&g.as_str()) || surface.gated_globals.contains_key(g),
            "global {g} is neither read-only nor gated"
        );
    }
    assert!(surface.gated_globals.contains_key("models.classify"));
    assert!(surface.gated_globals.contains_key("models.generateImages"));
    assert!(surface.gated_globals.contains_key("notify"));
}

#[tokio::test]
async fn every_tool_and_every_gated_global_passes_the_gate_with_provenance() {
    let world = world(Options::default()).await;
    let surface = world.codemode.script_surface();
    let mut scripts: Vec<(String, String)> = surface
        .tools
        .iter()
        .map(|t| (t.clone(), format!("return await tools[{:?}]({{}})", t)))
        .collect();
    for g in surface.gated_globals.keys() {
        let call = match g.as_str() {
            "models.classify" => format!(
                "return await models.classify({{ provider: \"p\", id: \"judge\" }}, {CLASSIFY_CONTEXT})"
            ),
            "models.generateImages" => "const r = await models.generateImages({ provider: \"p\", id: \"painter\" }, { input: [{ type: \"text\", text: \"a fox\" }] }); for (const b of r.output) image(b); return r.stopReason".to_string(),
            other => format!("return await {other}({{}})"),
        };
        scripts.push((g.clone(), call));
    }
    assert!(
        scripts.len() >= 6,
        "the surface is suspiciously small: {scripts:?}"
    );
    for (name, source) in scripts {
        let before = world.recorder.seen.lock().unwrap().len();
        let run = run(&world, &source).await;
        assert!(!run.is_error, "{name}: {}", run.structured());
        let seen = world.recorder.seen.lock().unwrap();
        let new: Vec<_> = seen[before..].iter().collect();
        assert_eq!(
            new.len(),
            2,
            "the script, then {name}, should each pass the gate once, saw {new:?}"
        );
        // The script itself is a call: origin model, depth 0, its hash and size as facts.
        let script_call = new[0];
        let hash = hex::encode(Sha256::digest(source.as_bytes()));
        assert_eq!(script_call.tool_name, "codemode");
        assert_eq!(script_call.provenance.origin, Origin::Model);
        assert_eq!(script_call.provenance.depth, 0);
        let facts = script_call.script.as_ref().expect("script facts");
        assert_eq!(facts.sha256, hash);
        assert_eq!(facts.bytes, source.len() as u64);
        let ev = new[1];
        assert_eq!(ev.tool_name, name);
        assert_eq!(
            ev.provenance.parent_call_id.as_deref(),
            Some(script_call.provenance.call_id.as_str()),
            "{name}: the parent is the codemode call"
        );
        assert_eq!(ev.provenance.origin, Origin::Script);
        assert_eq!(ev.provenance.depth, 1);
        assert_eq!(ev.provenance.session_id, "s1");
        assert_eq!(ev.provenance.seq, Some(1));
        assert_eq!(ev.provenance.script_hash.as_deref(), Some(hash.as_str()));
    }
}

#[tokio::test]
async fn read_only_helpers_reach_neither_the_gate_nor_a_provider() {
    let world = world(Options::default()).await;
    let run = run(
        &world,
        r#"const hits = await searchTools("echo");
           const d = await describeTool("echo");
           const n = await describeNamespace("nothing").catch(e => e.message);
           const all = await models.getModelsOfType("classifier");
           const avail = await models.getAvailableOfType("image");
           const one = await models.getModelOfType("classifier", "p", "judge");
           return { hits: hits.length, d: typeof d, n, all: all.length, avail: avail.length, one: one.id, keys: JSON.stringify(all) }"#,
    )
    .await;
    assert!(!run.is_error, "{}", run.text);
    let v = run.result.unwrap().value.unwrap();
    assert!(v["hits"].as_u64().unwrap() >= 1);
    assert_eq!(v["d"], "string");
    assert!(
        v["n"]
            .as_str()
            .unwrap()
            .starts_with("describeNamespace(\"nothing\")"),
        "{v}"
    );
    assert_eq!(v["all"], 1);
    assert_eq!(v["avail"], 1);
    assert_eq!(v["one"], "judge");
    // The catalog a script sees carries no URL or key.
    let keys = v["keys"].as_str().unwrap();
    assert!(
        !keys.contains("127.0.0.1") && !keys.contains("baseUrl"),
        "{keys}"
    );
    assert_eq!(
        world.recorder.names(),
        ["codemode"],
        "only the script itself passes the gate"
    );
    assert!(world.provider.requests().is_empty());
}

#[tokio::test]
async fn the_codemode_call_is_in_the_audit_log_and_its_calls_name_it() {
    let world = world(Options::default()).await;
    let run = run(
        &world,
        "await tools.echo({ a: 1 }); return await notify({})",
    )
    .await;
    assert!(!run.is_error, "{}", run.text);
    let lines = audit_lines(&world);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let script = lines.iter().find(|l| l["tool"] == "codemode").unwrap();
    assert_eq!(script["provenance"]["depth"], 0);
    assert_eq!(script["provenance"]["origin"], "model");
    assert_eq!(script["status"], "ok");
    assert!(script["script"]["sha256"].as_str().unwrap().len() == 64);
    let id = script["provenance"]["call_id"].as_str().unwrap();
    for line in lines.iter().filter(|l| l["tool"] != "codemode") {
        assert_eq!(line["provenance"]["parent_call_id"], id, "{line}");
    }
    // The script's line comes after its calls' lines: it ends last.
    assert_eq!(lines.last().unwrap()["tool"], "codemode");
}

#[tokio::test]
async fn a_policy_or_a_hook_can_stop_a_script_before_it_runs() {
    let policy = format!(
        "{PERMIT_ALL}@id(\"no-long-scripts\") forbid (principal, action == Action::\"tool_call\", resource == Tool::\"codemode\") when {{ context.script_bytes > 40 }};\n"
    );
    let world = world(Options {
        policy,
        ..Options::default()
    })
    .await;
    let long = "await tools.echo({}); await tools.echo({}); return 1";
    let refused = run(&world, long).await;
    assert!(refused.is_error);
    assert!(refused.text.contains("no-long-scripts"), "{}", refused.text);
    assert!(refused.result.is_none(), "nothing ran");
    // The policy refused it before any hook, and none of its calls reached the gate.
    assert!(world.recorder.names().is_empty());
    assert!(!run(&world, "return 1").await.is_error);

    world.recorder.deny.lock().unwrap().push("codemode".into());
    let denied = run(&world, "return await tools.echo({})").await;
    assert!(denied.is_error);
    assert!(
        denied.text.contains("the test hook denies codemode"),
        "{}",
        denied.text
    );
    let lines = audit_lines(&world);
    let last = lines.last().unwrap();
    assert_eq!(last["tool"], "codemode");
    assert_eq!(last["status"], "denied");
}
