//! Cedar policies: defaults, ask, errors at load, explain, path rules.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use codemode_gate::{
    ApprovalAnswer, ExplainInput, Gate, PolicyError, PolicySchema, PolicySet, Registry, Stage,
};
use codemode_spec::{DeadlineClock, Exposure};
use common::*;
use serde_json::json;

fn coding_tools() -> (Registry, Arc<std::sync::atomic::AtomicUsize>) {
    let reg = Registry::new();
    let read = TestTool::new("read", object_schema()).read_only();
    let write = TestTool::new("write", object_schema());
    let runs = write.runs.clone();
    reg.register(Arc::new(read)).unwrap();
    reg.register(Arc::new(write)).unwrap();
    reg.register(Arc::new(TestTool::new(
        "bash",
        json!({"type": "object", "properties": {"command": {"type": "string"}}}),
    )))
    .unwrap();
    reg.register(Arc::new(TestTool::new("fetch", object_schema())))
        .unwrap();
    (reg, runs)
}

#[test]
fn the_shipped_default_file_is_the_embedded_one_and_validates() {
    let on_disk = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policies/default.cedar"
    ))
    .unwrap();
    assert_eq!(on_disk, codemode_gate::policy::DEFAULT_POLICIES);
    let set = PolicySet::defaults();
    assert_eq!(
        set.ids(),
        [
            "read-only-tools-in-workspace",
            "ask-reads-outside-workspace",
            "ask-writes"
        ]
    );
    let (reg, _) = coding_tools();
    set.validate(&PolicySchema::for_registry(&reg).unwrap())
        .unwrap();
}

#[tokio::test]
async fn defaults_permit_reads_ask_for_writes_and_deny_the_rest() {
    let (reg, write_runs) = coding_tools();
    let gate = Gate::builder().registry(reg).build().unwrap();
    gate.call(req("read", json!({"path": "a"}), script("d")))
        .await
        .unwrap();

    for tool in ["write", "bash"] {
        let err = gate
            .call(req(tool, json!({}), script("d")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Approval, "{tool}");
        assert_eq!(err.policy_ids, ["ask-writes"]);
        assert!(err.message.contains("`ask-writes`"), "{}", err.message);
        assert!(
            err.message.contains("nobody is available to approve"),
            "{}",
            err.message
        );
    }
    assert_eq!(write_runs.load(Ordering::SeqCst), 0);

    let err = gate
        .call(req("fetch", json!({}), script("d")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert!(err.policy_ids.is_empty());
    assert!(
        err.message.contains("no policy permits tool `fetch`"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn approval_yes_no_always_and_the_clock_stands_still_while_asking() {
    let (reg, write_runs) = coding_tools();

    let no = FixedApprover::new(ApprovalAnswer::No);
    let gate = Gate::builder()
        .registry(reg.clone())
        .approver(no.clone())
        .build()
        .unwrap();
    let err = gate
        .call(req("write", json!({"path": "x"}), script("a")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Approval);
    assert!(err.message.contains("not approved"), "{}", err.message);
    assert_eq!(write_runs.load(Ordering::SeqCst), 0);
    let q = no.asked.lock().unwrap()[0].clone();
    assert_eq!(q.tool_name, "write");
    assert_eq!(q.policy_ids, ["ask-writes"]);
    assert_eq!(q.args, json!({"path": "x"}));

    let mut slow = FixedApprover::new(ApprovalAnswer::Yes);
    Arc::get_mut(&mut slow).unwrap().delay_ms = 300;
    let gate = Gate::builder()
        .registry(reg.clone())
        .approver(slow.clone())
        .build()
        .unwrap();
    let clock = DeadlineClock::new();
    let mut r = req("write", json!({}), script("a"));
    r.clock = Some(clock.clone());
    gate.call(r).await.unwrap();
    assert_eq!(write_runs.load(Ordering::SeqCst), 1);
    assert!(
        clock.paused() >= Duration::from_millis(300),
        "{:?}",
        clock.paused()
    );
    assert!(!clock.is_paused());

    let always = FixedApprover::new(ApprovalAnswer::Always);
    let gate = Gate::builder()
        .registry(reg)
        .approver(always.clone())
        .build()
        .unwrap();
    for _ in 0..3 {
        gate.call(req("write", json!({}), script("b")))
            .await
            .unwrap();
    }
    assert_eq!(
        always.asked.lock().unwrap().len(),
        1,
        "always is remembered for the script"
    );
    gate.call(req("bash", json!({}), script("b")))
        .await
        .unwrap();
    assert_eq!(always.asked.lock().unwrap().len(), 2, "always is per tool");
    gate.call(req("write", json!({}), script("c")))
        .await
        .unwrap();
    assert_eq!(
        always.asked.lock().unwrap().len(),
        3,
        "always is per script"
    );
    gate.end_script("b");
    gate.call(req("write", json!({}), script("b")))
        .await
        .unwrap();
    assert_eq!(
        always.asked.lock().unwrap().len(),
        4,
        "ending the script forgets it"
    );
}

#[test]
fn syntax_errors_name_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.cedar");
    std::fs::write(
        &file,
        "// first policy is fine\npermit(principal, action, resource);\n\nforbid(principal, action resource);\n",
    )
    .unwrap();
    let name = file.display().to_string();
    let text = std::fs::read_to_string(&file).unwrap();
    let err = PolicySet::parse(&name, &text).unwrap_err();
    match &err {
        PolicyError::Syntax { file: f, line, .. } => {
            assert!(f.ends_with("broken.cedar"));
            assert_eq!(*line, 4, "{err}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert!(err.to_string().contains("broken.cedar:4:"), "{err}");
    let reg = Registry::new();
    assert!(codemode_gate::check(&name, &text, &reg).is_err());
}

#[test]
fn policies_that_do_not_fit_the_schema_are_refused_at_build() {
    let (reg, _) = coding_tools();
    let text = "@id(\"ok\")\npermit(principal, action, resource);\n\n@id(\"typo\")\npermit(principal, action == Action::\"tool_call\", resource)\nwhen { resource.read_onyl };\n";
    let set = PolicySet::parse("typo.cedar", text).unwrap();
    let err = Gate::builder()
        .registry(reg.clone())
        .policy(set)
        .build()
        .err()
        .unwrap();
    match &err {
        PolicyError::Invalid {
            policy_id, line, ..
        } => {
            assert_eq!(policy_id, "typo");
            assert_eq!(*line, 6, "{err}");
        }
        other => panic!("expected a schema error, got {other:?}"),
    }
    // An argument no tool declares fails too; one that a tool declares passes.
    let bad = PolicySet::parse("a.cedar", "forbid(principal, action, resource) when { context.args has nope && context.args.nope == \"x\" };").unwrap();
    assert!(
        Gate::builder()
            .registry(reg.clone())
            .policy(bad)
            .build()
            .is_err()
    );
    let good = PolicySet::parse("a.cedar", "forbid(principal, action, resource) when { context.args has command && context.args.command like \"rm *\" };").unwrap();
    assert!(Gate::builder().registry(reg).policy(good).build().is_ok());
}

#[test]
fn duplicate_ids_and_untrusted_permits_are_errors() {
    let text = "@id(\"x\") permit(principal, action, resource);\n@id(\"x\") forbid(principal, action, resource);";
    assert!(matches!(
        PolicySet::parse("d.cedar", text),
        Err(PolicyError::Duplicate { .. })
    ));
    let mut set = PolicySet::empty();
    let err = set
        .add_source("project.cedar", "forbid(principal, action, resource) when { false };\npermit(principal, action, resource);", true)
        .unwrap_err();
    assert!(
        matches!(err, PolicyError::NotForbidOnly { line: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn add_forbids_leaves_permits_out_and_names_them() {
    let mut set = PolicySet::empty();
    let skipped = set
        .add_forbids(
            "project.cedar",
            "@id(\"no-bash\") forbid(principal, action, resource == Tool::\"bash\");\n@id(\"all\") permit(principal, action, resource);",
        )
        .unwrap();
    assert_eq!(skipped, [("all".to_string(), 2)]);
    assert_eq!(set.ids(), ["no-bash"]);
    // Copying the set does not bring the permit back.
    let mut copy = PolicySet::empty();
    copy.extend(set).unwrap();
    assert_eq!(copy.ids(), ["no-bash"]);
}

#[tokio::test]
async fn args_paths_and_counts_reach_the_context() {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new(
        "bash",
        json!({"type": "object", "properties": {"command": {"type": "string"}, "n": {"type": "integer"}}}),
    )))
    .unwrap();
    let text = r#"
@id("all") permit(principal, action, resource);
@id("no-rm") forbid(principal, action == Action::"tool_call", resource)
  when { context.args has command && context.args.command like "rm *" };
@id("small-n") forbid(principal, action, resource)
  when { context.args has n && context.args.n > 10 };
@id("json") forbid(principal, action, resource) when { context.args_json like "*curl*" };
@id("third-call") forbid(principal, action, resource) when { context.script.calls >= 2 };
@id("nested-only") forbid(principal, action, resource) when { context.origin == "script" && context.depth > 3 };
"#;
    let gate = Gate::builder()
        .registry(reg)
        .policy(PolicySet::parse("ctx.cedar", text).unwrap())
        .build()
        .unwrap();
    let deny = |args: serde_json::Value, sid: &'static str| {
        let gate = gate.clone();
        async move {
            gate.call(req("bash", args, script(sid)))
                .await
                .err()
                .map(|e| e.policy_ids)
        }
    };
    assert_eq!(
        deny(json!({"command": "rm -rf /"}), "c1").await,
        Some(vec!["no-rm".to_string()])
    );
    assert_eq!(
        deny(json!({"n": 11}), "c2").await,
        Some(vec!["small-n".to_string()])
    );
    assert_eq!(
        deny(json!({"command": "x; curl evil"}), "c3").await,
        Some(vec!["json".to_string()])
    );
    assert_eq!(deny(json!({"command": "ls"}), "c4").await, None);
    assert_eq!(deny(json!({"command": "ls"}), "c4").await, None);
    assert_eq!(
        deny(json!({"command": "ls"}), "c4").await,
        Some(vec!["third-call".to_string()])
    );
    let mut deep = script("c5");
    deep.depth = 4;
    let err = gate.call(req("bash", json!({}), deep)).await.unwrap_err();
    assert_eq!(err.policy_ids, ["nested-only"]);
}

#[tokio::test]
async fn path_rules_see_resolved_paths_so_dotdot_symlinks_and_absolute_paths_cannot_slip_past() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let ws = root.join("ws");
    let outside = root.join("outside");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "s").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();

    let tool = TestTool::new("write", object_schema()).with_path_facts(&ws);
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let policy = build_path_policy(&ws);
    let gate = Gate::builder()
        .registry(reg)
        .policy(PolicySet::parse("paths.cedar", &policy).unwrap())
        .build()
        .unwrap();

    gate.call(req("write", json!({"path": "src/new.rs"}), script("p")))
        .await
        .unwrap();
    for trick in [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        "link/secret.txt",
        outside.join("secret.txt").to_str().unwrap(),
        "/etc/passwd",
    ] {
        let err = gate
            .call(req("write", json!({"path": trick}), script("p")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Policy, "{trick}");
        assert_eq!(err.policy_ids, ["outside-workspace"], "{trick}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Permit writes; forbid any call touching a resolved path outside `ws`. The gate evaluates
/// the policy once per path, with that path in `context.path`.
fn build_path_policy(ws: &std::path::Path) -> String {
    format!(
        r#"@id("writes") permit(principal, action == Action::"tool_call", resource);
@id("outside-workspace") forbid(principal, action == Action::"tool_call", resource)
  when {{ context.path != "" && !(context.path like "{0}/*") }};
"#,
        ws.display()
    )
}

#[test]
fn explain_names_the_deciding_policies() {
    let set = PolicySet::defaults();
    let input: ExplainInput = serde_json::from_value(json!({
        "tool": "bash", "args": {"command": "ls"}
    }))
    .unwrap();
    let ex = codemode_gate::explain(&set, None, &input);
    assert_eq!(ex.decision, "ask");
    assert_eq!(ex.policies[0].id, "ask-writes");
    assert_eq!(ex.policies[0].file, "default.cedar");
    assert_eq!(ex.policies[0].line, 26);
    assert_eq!(ex.policies[0].effect, "permit");

    let input: ExplainInput = serde_json::from_value(json!({
        "tool": "read", "annotations": {"readOnlyHint": true}
    }))
    .unwrap();
    assert_eq!(codemode_gate::explain(&set, None, &input).decision, "allow");

    let input: ExplainInput = serde_json::from_value(json!({"tool": "fetch"})).unwrap();
    let ex = codemode_gate::explain(&set, None, &input);
    assert_eq!(ex.decision, "deny");
    assert!(ex.policies.is_empty());
    assert!(ex.summary.contains("no policy permits"), "{}", ex.summary);

    assert!(serde_json::from_value::<ExplainInput>(json!({"tool": "x", "bogus": 1})).is_err());
}

/// Every fact the gate gives the policy, with its value and its Cedar type: one forbid per fact,
/// each matching only if the fact arrived exactly so. All of them must decide.
#[test]
fn every_context_field_and_resource_attribute_reaches_the_policy_with_its_type() {
    let facts = [
        ("a-str", r#"context.args.command == "ls -l""#),
        ("a-long", "context.args.n == -7"),
        ("a-bool", "context.args.flag == true"),
        ("a-set", r#"context.args.tags == ["x", "y"]"#),
        ("a-no-object", "!(context.args has nested)"),
        ("a-no-float", "!(context.args has ratio)"),
        ("a-no-mixed-set", "!(context.args has mixed)"),
        ("json", r#"context.args_json like "*\"nested\":{\"k\":1}*""#),
        ("paths", r#"context.paths == ["/w/a", "/w/b"]"#),
        (
            "path",
            r#"context.path == "/w/a" || context.path == "/w/b""#,
        ),
        ("origin", r#"context.origin == "script""#),
        ("depth", "context.depth == 3"),
        ("parent", r#"context.parent == "run-1""#),
        ("script-id", r#"context.script_id == """#),
        ("hash", r#"context.script_hash == "abc""#),
        ("bytes", "context.script_bytes == 42"),
        ("in-ws", "context.in_workspace == true"),
        ("client", r#"context.client == """#),
        (
            "s-counts",
            "context.script == {calls: 2, model_calls: 1, tokens: 30, cost_micro_usd: 4}",
        ),
        (
            "sess-counts",
            "context.session.calls == 5 && context.session.cost_micro_usd == 9",
        ),
        ("principal", r#"principal == Session::"s-1""#),
        (
            "tool",
            r#"resource == Tool::"mcp__srv__act" && resource.name == "mcp__srv__act""#,
        ),
        (
            "ns",
            r#"resource.namespace == "mcp__srv" && resource.kind == "tool""#,
        ),
        ("exposure", r#"resource.exposure == "hidden""#),
        (
            "hints",
            "!resource.read_only && resource.destructive == false && resource.idempotent && !resource.open_world",
        ),
    ];
    let mut text = String::from("@id(\"all\") permit(principal, action, resource);\n");
    for (id, cond) in facts {
        text.push_str(&format!(
            "@id(\"{id}\") forbid(principal, action, resource) when {{ {cond} }};\n"
        ));
    }
    let set = PolicySet::parse("facts.cedar", &text).unwrap();
    let input: ExplainInput = serde_json::from_value(json!({
        "tool": "mcp__srv__act", "namespace": "mcp__srv", "exposure": "hidden",
        "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
        "args": {"command": "ls -l", "n": -7, "flag": true, "tags": ["x", "y"], "nested": {"k": 1},
                 "ratio": 0.5, "mixed": ["x", 1]},
        "paths": ["/w/a", "/w/b"], "workspace": "/w", "depth": 3, "session_id": "s-1",
        "parent_call_id": "run-1", "script_hash": "abc",
        "script_facts": {"sha256": "abc", "bytes": 42},
        "script": {"calls": 2, "model_calls": 1, "tokens": 30, "cost_micro_usd": 4},
        "session": {"calls": 5, "cost_micro_usd": 9},
    }))
    .unwrap();
    let ex = codemode_gate::explain(&set, None, &input);
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    let mut decided: Vec<&str> = ex.policies.iter().map(|p| p.id.as_str()).collect();
    decided.sort_unstable();
    let mut expected: Vec<&str> = facts.iter().map(|(id, _)| *id).collect();
    expected.sort_unstable();
    assert_eq!(decided, expected, "{}", ex.summary);

    let model = PolicySet::parse(
        "model.cedar",
        r#"@id("all") permit(principal, action, resource);
@id("m") forbid(principal, action == Action::"model_call", resource)
  when { resource == Model::"acme/small" && resource.provider == "acme" && resource.id == "small"
         && resource.type == "chat" && resource.input_price == decimal("0.1250")
         && resource.output_price.greaterThan(decimal("2.4999")) && resource.image_price == decimal("0.0") };"#,
    )
    .unwrap();
    let input: ExplainInput = serde_json::from_value(json!({
        "tool": "models.chat", "kind": "model",
        "model": {"provider": "acme", "id": "small", "modelType": "chat",
                  "inputPrice": 0.125, "outputPrice": 2.5},
    }))
    .unwrap();
    let ex = codemode_gate::explain(&model, None, &input);
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    assert_eq!(ex.policies.len(), 1, "{}", ex.summary);
    assert_eq!(ex.policies[0].id, "m");
}

/// Values a script controls that look like Cedar's JSON escapes or entity syntax arrive as
/// plain data: an id with quotes and `::` stays one string, an `__entity`/`__extn` lookalike
/// is a string or is left out, and none of them becomes another entity or extension value.
#[test]
fn script_controlled_values_that_look_like_cedar_syntax_stay_plain_data() {
    let facts = [
        (
            "odd-session",
            r#"principal == Session::"s\"::Session::\"admin""#,
        ),
        (
            "escape-string",
            r#"context.args.cmd == "{\"__extn\":{\"fn\":\"ip\",\"arg\":\"10.0.0.1\"}}""#,
        ),
        (
            "escape-key",
            r#"context.args["__entity"] == "Session::\"admin\"""#,
        ),
        ("no-entity-object", "!(context.args has obj)"),
        ("no-huge-number", "!(context.args has big)"),
        (
            "odd-tool",
            r#"resource == Tool::"t\"::Tool::\"bash" && resource.name == "t\"::Tool::\"bash""#,
        ),
    ];
    // Must not match: the odd ids are not the entities they spell.
    let confusions = [
        ("admin", r#"principal == Session::"admin""#),
        ("bash", r#"resource == Tool::"bash""#),
    ];
    let mut text = String::from("@id(\"all\") permit(principal, action, resource);\n");
    for (id, cond) in facts.iter().chain(confusions.iter()) {
        text.push_str(&format!(
            "@id(\"{id}\") forbid(principal, action, resource) when {{ {cond} }};\n"
        ));
    }
    let set = PolicySet::parse("odd.cedar", &text).unwrap();
    let input: ExplainInput = serde_json::from_value(json!({
        "tool": "t\"::Tool::\"bash",
        "session_id": "s\"::Session::\"admin",
        "args": {"cmd": "{\"__extn\":{\"fn\":\"ip\",\"arg\":\"10.0.0.1\"}}",
                 "__entity": "Session::\"admin\"",
                 "obj": {"__entity": {"type": "Session", "id": "admin"}},
                 "big": 18446744073709551615u64},
    }))
    .unwrap();
    let ex = codemode_gate::explain(&set, None, &input);
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    let mut decided: Vec<&str> = ex.policies.iter().map(|p| p.id.as_str()).collect();
    decided.sort_unstable();
    let mut expected: Vec<&str> = facts.iter().map(|(id, _)| *id).collect();
    expected.sort_unstable();
    assert_eq!(decided, expected, "{}", ex.summary);
}

/// A set argument costs the policy engine about 240 bytes an item: a million strings took the
/// host 230 MiB more per decision. Policies that read `context.args` are not given a set past
/// 65,536 items (the call is refused, never decided on part of it); policies that read neither
/// `args` nor `args_json` are not given the arguments at all, and decide as before.
#[test]
fn a_set_argument_too_big_for_the_policy_refuses_the_call_only_when_args_are_read() {
    let call = |items: usize| -> ExplainInput {
        let tags: Vec<String> = (0..items).map(|i| format!("t{i}")).collect();
        serde_json::from_value(json!({"tool": "mcp__srv__act", "args": {"tags": tags}})).unwrap()
    };
    let reads_args = permit_all_but(r#"context.args has tags && context.args.tags.contains("t5")"#);
    let ex = codemode_gate::explain(&reads_args, None, &call(10));
    assert_eq!(
        ex.decision, "deny",
        "the forbid sees the set: {}",
        ex.summary
    );
    let ex = codemode_gate::explain(&reads_args, None, &call(65_536));
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    let ex = codemode_gate::explain(&reads_args, None, &call(65_537));
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    assert!(
        ex.summary.contains("`tags` holds 65537 items") && ex.summary.contains("at most 65536"),
        "{}",
        ex.summary
    );
    // `\u{61}rgs` is `args`: a read spelled so the word is not written is still a read.
    let escaped = permit_all_but(r#"context["\u{61}rgs"] has tags"#);
    let ex = codemode_gate::explain(&escaped, None, &call(65_537));
    assert!(ex.summary.contains("holds 65537 items"), "{}", ex.summary);
    let ignores_args = permit_all_but(r#"context.path like "/etc/*""#);
    let ex = codemode_gate::explain(&ignores_args, None, &call(200_000));
    assert_eq!(ex.decision, "allow", "{}", ex.summary);
    let reads_json = permit_all_but(r#"context.args_json like "*t199999*""#);
    let ex = codemode_gate::explain(&reads_json, None, &call(200_000));
    assert_eq!(
        ex.decision, "deny",
        "args_json is still built when read: {}",
        ex.summary
    );
}

#[test]
fn a_policy_that_fails_to_evaluate_denies() {
    // Without a schema the validator cannot catch this; the gate must still fail closed.
    let set = PolicySet::parse(
        "e.cedar",
        "@id(\"p\") permit(principal, action, resource);\n@id(\"f\") forbid(principal, action, resource) when { context.args.missing == 1 };",
    )
    .unwrap();
    let input: ExplainInput = serde_json::from_value(json!({"tool": "x"})).unwrap();
    let ex = codemode_gate::explain(&set, None, &input);
    assert_eq!(ex.decision, "deny", "{}", ex.summary);
    assert!(
        ex.summary.contains("could not be evaluated"),
        "{}",
        ex.summary
    );
}

#[tokio::test]
async fn hidden_exposure_is_a_resource_attribute_policies_can_use() {
    let reg = Registry::new();
    reg.register(Arc::new(
        TestTool::new("d", object_schema()).exposure(Exposure::Deferred),
    ))
    .unwrap();
    let set = PolicySet::parse("x.cedar", "@id(\"deferred\") permit(principal, action, resource is Tool) when { resource.exposure == \"deferred\" && resource.open_world };").unwrap();
    let gate = Gate::builder().registry(reg).policy(set).build().unwrap();
    gate.call(req("d", json!({}), script("h"))).await.unwrap();
}

#[tokio::test]
async fn the_shipped_examples_validate_and_decide_as_documented() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policies/examples.cedar"
    ))
    .unwrap();
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new(
        "bash",
        json!({"type": "object", "properties": {"command": {"type": "string"}}}),
    )))
    .unwrap();
    reg.register(Arc::new(TestTool::model(
        "models.classify",
        "acme",
        "small",
        Default::default(),
    )))
    .unwrap();
    let mut set = PolicySet::parse("examples.cedar", &text).unwrap();
    set.extend(PolicySet::defaults()).unwrap();
    let gate = Gate::builder().registry(reg).policy(set).build().unwrap();
    let err = gate
        .call(req("bash", json!({"command": "rm -rf /"}), script("ex")))
        .await
        .unwrap_err();
    assert_eq!(err.policy_ids, ["no-rm-rf-from-scripts"]);
    gate.call(req("models.classify", json!({"text": "x"}), script("ex")))
        .await
        .unwrap();
}

#[test]
fn the_gate_and_its_call_future_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Gate>();
    let gate = Gate::builder().build().unwrap();
    let fut = gate.call(req("x", json!({}), script("s")));
    send(&fut);
}

#[test]
fn gate_explain_uses_its_own_policies() {
    let (reg, _) = coding_tools();
    let gate = Gate::builder().registry(reg).build().unwrap();
    let input: ExplainInput =
        serde_json::from_value(json!({"tool": "write", "args": {"path": "a"}})).unwrap();
    let ex = gate.explain(&input);
    assert_eq!(ex.decision, "ask");
    assert_eq!(ex.policies[0].id, "ask-writes");
}

/// Red team: "always" was remembered per session for calls outside a script, so "always" given
/// to one harmless direct `bash` let the model run any command unasked for the rest of the
/// session, and the audit lines of asked and unasked calls read the same. A direct call's
/// "always" now approves that call alone; in a script, the calls it covers say so in the log.
#[tokio::test]
async fn always_outside_a_script_approves_one_call_and_the_log_tells_asked_from_covered() {
    let reg = Registry::new();
    let write = TestTool::new("write", object_schema()).exposure(Exposure::Direct);
    reg.register(Arc::new(write)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (audit, log) = audit_in(dir.path());
    let always = FixedApprover::new(ApprovalAnswer::Always);
    let gate = Gate::builder()
        .registry(reg)
        .approver(always.clone())
        .audit(audit)
        .build()
        .unwrap();
    for i in 0..3 {
        let direct = codemode_spec::Provenance::model(format!("direct-{i}"), "session-1");
        gate.call(req("write", json!({}), direct)).await.unwrap();
    }
    assert_eq!(
        always.asked.lock().unwrap().len(),
        3,
        "each direct call was asked"
    );
    for _ in 0..2 {
        gate.call(req("write", json!({}), script("s")))
            .await
            .unwrap();
    }
    assert_eq!(always.asked.lock().unwrap().len(), 4);
    let decisions: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["tool"] == "write")
        .map(|v| v["decision"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(decisions, ["ask", "ask", "ask", "ask", "always"]);
}

/// Red team: `@ask` was read in lower case only, so a permit written `@Ask("confirm every
/// command")` let `bash` run without asking anyone. Any case of the annotation asks.
#[tokio::test]
async fn an_ask_annotation_in_any_case_asks() {
    for annotation in ["@Ask", "@ASK", "@ask"] {
        let reg = Registry::new();
        let bash = TestTool::new("bash", object_schema());
        let runs = bash.runs.clone();
        reg.register(Arc::new(bash)).unwrap();
        let policy = PolicySet::parse(
            "p.cedar",
            &format!(
                r#"@id("confirm") {annotation}("confirm every command") permit(principal, action, resource == Tool::"bash");"#
            ),
        )
        .unwrap();
        let no = FixedApprover::new(ApprovalAnswer::No);
        let gate = Gate::builder()
            .registry(reg)
            .policy(policy)
            .approver(no.clone())
            .build()
            .unwrap();
        let err = gate
            .call(req("bash", json!({}), script("s")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Approval, "{annotation}: {}", err.message);
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{annotation}");
        assert_eq!(no.asked.lock().unwrap().len(), 1, "{annotation}");
    }
}

/// An MCP server's tool (in namespace `mcp__<server>`) with one argument `arg` of JSON type `ty`.
fn upstream_tool(name: &str, arg: &str, ty: &str) -> TestTool {
    let mut tool = TestTool::new(
        name,
        json!({"type": "object", "properties": {arg: {"type": ty}}}),
    );
    let server = name.rsplit_once("__").map_or(name, |(server, _)| server);
    tool.spec.namespace = Some(server.to_string());
    tool
}

/// Everything permitted but what `when` forbids.
fn permit_all_but(when: &str) -> PolicySet {
    PolicySet::parse(
        "p.cedar",
        &format!(
            r#"@id("all") permit(principal, action, resource);
               @id("but") forbid(principal, action, resource) when {{ {when} }};"#
        ),
    )
    .unwrap()
}

/// Red team: `context.args` is typed from every tool's schema, and a name two tools typed
/// differently was dropped. An MCP server listing a tool with `command: integer` thereby took
/// `command` out of every call's context, and a `forbid` on the built-in `bash` guarded by
/// `context.args has command` stopped applying: `rm -rf` ran. The built-ins' types win.
#[tokio::test]
async fn an_upstream_tool_cannot_take_a_builtins_argument_out_of_the_policys_sight() {
    let reg = Registry::new();
    let bash = TestTool::new(
        "bash",
        json!({"type": "object", "properties": {"command": {"type": "string"}}}),
    );
    let runs = bash.runs.clone();
    reg.register(Arc::new(bash)).unwrap();
    reg.register(Arc::new(upstream_tool(
        "mcp__evil__poison",
        "command",
        "integer",
    )))
    .unwrap();
    let gate = Gate::builder()
        .registry(reg.clone())
        .policy(permit_all_but(
            r#"context.args has command && context.args.command like "*rm -rf*""#,
        ))
        .build()
        .unwrap();
    let err = gate
        .call(req(
            "bash",
            json!({"command": "rm -rf victim"}),
            script("s"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy, "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The upstream tool's own call is judged without the value that does not fit.
    gate.call(req("mcp__evil__poison", json!({"command": 7}), script("s")))
        .await
        .unwrap();
    // Two upstream tools that disagree keep the name, as text, and say so.
    reg.register(Arc::new(upstream_tool("mcp__b__t", "limit", "string")))
        .unwrap();
    reg.register(Arc::new(upstream_tool("mcp__c__t", "limit", "integer")))
        .unwrap();
    let schema = PolicySchema::for_registry(&reg).unwrap();
    assert!(
        schema
            .conflicts()
            .iter()
            .any(|c| c.contains("context.args.limit") && c.contains("mcp__b__t")),
        "{:?}",
        schema.conflicts()
    );
    assert!(
        schema.text().contains("\"command\"?: String"),
        "{}",
        schema.text()
    );
    // A name two servers disagree on stays in sight, as text: one server cannot take it out
    // of the context of the other's calls.
    let policy = permit_all_but(r#"context.args has limit && context.args.limit like "*9*""#);
    let gate = Gate::builder()
        .registry(reg)
        .policy(policy)
        .build()
        .unwrap();
    for (tool, limit) in [("mcp__b__t", json!("x9")), ("mcp__c__t", json!(9))] {
        let err = gate
            .call(req(tool, json!({"limit": limit}), script("s")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Policy, "{tool}: {}", err.message);
    }
    gate.call(req("mcp__c__t", json!({"limit": 5}), script("s")))
        .await
        .unwrap();
}
