//! Validation: every JSON type, no coercion, each problem with its path.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use codemode_gate::{Registry, Stage};
use common::*;
use serde_json::{Value, json};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "a": {"type": "array", "items": {"type": "string"}},
            "o": {"type": "object", "properties": {"deep": {"type": "integer"}}, "required": ["deep"]},
            "z": {"type": "null"}
        },
        "required": ["s"],
        "additionalProperties": false
    })
}

async fn refused(args: Value) -> String {
    let tool = TestTool::new("t", schema());
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    let err = gate.call(req("t", args, script("v"))).await.unwrap_err();
    assert_eq!(err.stage, Stage::Validate, "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "invalid call must not run");
    err.message
}

#[tokio::test]
async fn wrong_type_of_every_json_kind_is_refused_without_coercion() {
    // Each of these would be "fixed" by a coercing validator.
    let cases = [
        (json!({"s": 5}), "/s"),
        (json!({"s": "x", "i": "5"}), "/i"),
        (json!({"s": "x", "i": 1.5}), "/i"),
        (json!({"s": "x", "n": "1.5"}), "/n"),
        (json!({"s": "x", "b": "true"}), "/b"),
        (json!({"s": "x", "a": "one"}), "/a"),
        (json!({"s": "x", "a": ["ok", 2]}), "/a/1"),
        (json!({"s": "x", "o": "{}"}), "/o"),
        (json!({"s": "x", "o": {"deep": "1"}}), "/o/deep"),
        (json!({"s": "x", "z": 0}), "/z"),
        (json!({"s": null}), "/s"),
    ];
    for (args, path) in cases {
        let msg = refused(args.clone()).await;
        assert!(msg.contains(&format!("- {path}:")), "{args} → {msg}");
        assert!(msg.contains("Received:"), "{msg}");
    }
    for not_object in [json!("s"), json!(1), json!(true), json!(null), json!([1])] {
        let msg = refused(not_object.clone()).await;
        assert!(msg.contains("- /:"), "{not_object} → {msg}");
    }
}

/// A million wrong items made a million problem lines: a 50 MB error for the script, and half
/// a GB on the host while the validator built them. Arguments of more than 10,000 values get
/// their first problem; smaller ones at most twenty, and that there are more.
#[tokio::test]
async fn many_wrong_items_list_a_bounded_number_of_problems() {
    let items: Vec<u32> = (0..1_000_000).collect();
    let msg = refused(json!({"s": "x", "a": items})).await;
    assert!(
        msg.contains("(the first problem; large arguments are not checked for more)"),
        "{}",
        &msg[..msg.len().min(500)]
    );
    assert!(msg.contains("- /a/0:") && !msg.contains("- /a/1:"), "{msg}");
    assert!(msg.len() < 4_000, "{} bytes", msg.len());
    let items: Vec<u32> = (0..5_000).collect();
    let msg = refused(json!({"s": "x", "a": items})).await;
    assert!(
        msg.contains("(more than 20 problems; the first 20)"),
        "{msg}"
    );
    assert!(
        msg.contains("- /a/19:") && !msg.contains("- /a/20:"),
        "{msg}"
    );
    assert!(msg.contains("(more not shown)"), "{msg}");
    let twenty: Vec<u32> = (0..20).collect();
    let msg = refused(json!({"s": "x", "a": twenty})).await;
    assert!(
        msg.contains("(20 problems)") && !msg.contains("more not shown"),
        "{msg}"
    );
}

#[tokio::test]
async fn every_problem_is_listed() {
    let msg = refused(json!({"i": "x", "b": 1, "extra": true})).await;
    assert!(msg.contains("(4 problems)"), "{msg}");
    assert!(msg.contains("- /i:"), "{msg}");
    assert!(msg.contains("- /b:"), "{msg}");
    assert!(
        msg.contains("\"s\" is a required property") || msg.contains("required"),
        "{msg}"
    );
    assert!(msg.contains("extra"), "{msg}");
}

#[tokio::test]
async fn valid_arguments_pass_unchanged() {
    let tool = TestTool::new("t", schema());
    let seen = tool.seen.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    let args =
        json!({"s": "x", "i": 3, "n": 1.5, "b": false, "a": ["p"], "o": {"deep": 1}, "z": null});
    gate.call(req("t", args.clone(), script("v")))
        .await
        .unwrap();
    assert_eq!(seen.lock().unwrap()[0], args);
}

#[tokio::test]
async fn a_tool_with_an_invalid_schema_is_refused_not_run() {
    let tool = TestTool::new("bad", json!({"type": "no-such-type"}));
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    let err = gate
        .call(req("bad", json!({}), script("v")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Validate);
    assert!(err.message.contains("schema is invalid"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Red team: a 3 KB schema of `$defs` that each try the next one twice made one call's
/// validation take 86 s and 6.6 GB (22 levels), on a host thread, past the script's deadline.
/// Such a schema is not checked at all: the tool's calls are refused at once.
#[tokio::test]
async fn a_schema_that_expands_exponentially_is_refused_not_checked() {
    let mut defs = serde_json::Map::new();
    for i in 0..22 {
        let next = format!("#/$defs/l{}", i + 1);
        defs.insert(
            format!("l{i}"),
            json!({"anyOf": [{"$ref": next}, {"$ref": next, "title": "x"}]}),
        );
    }
    defs.insert("l22".into(), json!({"type": "string"}));
    let schema =
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/l0"}}, "$defs": defs});
    let reg = Registry::new();
    let tool = TestTool::new("slow", schema);
    let runs = tool.runs.clone();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    let err = gate
        .call(req("slow", json!({"a": "x"}), script("s")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Validate, "{}", err.message);
    assert!(err.message.contains("expands past"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Validators are compiled at a tool's first call, not at registration. Attacked where that
/// could fail open: a burst of first calls racing to compile it, and a tool swapped in place
/// (a server's `list_changed`) after its old schema was compiled, whose next calls must be
/// judged by the new schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazily_compiled_schema_holds_under_a_burst_and_after_a_swap() {
    let strict = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let reg = Registry::new();
    let tool = TestTool::new("lazy", strict.clone());
    let runs = tool.runs.clone();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    let burst = (0..64).map(|i| {
        let gate = gate.clone();
        let args = if i % 2 == 0 {
            json!({"n": "not a number"})
        } else {
            json!({"n": i})
        };
        async move { gate.call(req("lazy", args, script("burst"))).await }
    });
    let results = futures::future::join_all(burst).await;
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(_) => assert!(i % 2 == 1, "call {i} with a bad argument ran"),
            Err(e) => {
                assert!(i % 2 == 0, "call {i} was refused: {}", e.message);
                assert_eq!(e.stage, Stage::Validate, "{}", e.message);
            }
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 32);

    // Swapped for a version that takes anything, then back to a strict one: each call is
    // judged by the schema of the version registered when it is made.
    let open = TestTool::new("lazy", json!({"type": "object"}));
    let open_runs = open.runs.clone();
    reg.install(Arc::new(open), codemode_spec::Exposure::Codemode)
        .unwrap();
    gate.call(req("lazy", json!({"n": "text", "x": 1}), script("swap")))
        .await
        .expect("the open version takes any object");
    assert_eq!(open_runs.load(Ordering::SeqCst), 1);
    let strict_again = TestTool::new("lazy", strict);
    let strict_runs = strict_again.runs.clone();
    reg.install(Arc::new(strict_again), codemode_spec::Exposure::Codemode)
        .unwrap();
    let err = gate
        .call(req("lazy", json!({"n": "text", "x": 1}), script("swap")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Validate, "{}", err.message);
    assert_eq!(strict_runs.load(Ordering::SeqCst), 0);
}

/// `uniqueItems` through the gate, with the items that made jsonschema's own check quadratic:
/// 2^20 integers past 2^63, 2,048 to each float. All distinct, the call runs; one repeated (at
/// the end, so every item is checked first), it is refused, naming the array. Before, checking
/// these took seconds of host CPU, past the script's deadline; this test does not time it (the
/// unit tests count the comparisons), it checks that the answer is exact.
#[tokio::test]
async fn unique_items_tells_apart_integers_a_float_cannot() {
    let schema = json!({
        "type": "object",
        "properties": {"ids": {"type": "array", "uniqueItems": true}}
    });
    let base = 1u64 << 63;
    let mut ids: Vec<u64> = (0..1u64 << 20).map(|k| base + k).collect();
    let tool = TestTool::new("t", schema);
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg).build().unwrap();
    gate.call(req("t", json!({"ids": ids}), script("v")))
        .await
        .expect("distinct integers pass");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    ids.push(base + 7);
    let err = gate
        .call(req("t", json!({"ids": ids}), script("v")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Validate, "{}", err.message);
    assert!(
        err.message.contains("- /ids:") && err.message.contains("non-unique"),
        "{}",
        &err.message[..err.message.len().min(500)]
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the refused call did not run"
    );
}
