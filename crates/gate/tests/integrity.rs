//! The gate attacked: bursts of parallel calls against count and cost rules (with and without
//! slow hooks), every hook answer that is not an allow, hooks outliving their call, policy
//! templates, writes to protected paths, reads outside the workspace, and callers that drop a
//! call half way.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use codemode_gate::{
    CommandHooks, Gate, HookSettings, PolicyError, PolicySet, ProtectedPath, Registry, Stage,
};
use codemode_spec::{Annotations, CallFacts, CallKind, ModelFacts, Usage};
use common::*;
use futures::future::join_all;
use serde_json::{Value, json};

const BURST: usize = 50;

fn slow_hook(dir: &Path) -> CommandHooks {
    let path = dir.join("slow.sh");
    std::fs::write(&path, "#!/bin/sh\ncat > /dev/null\nsleep 0.3\n").unwrap();
    let settings: HookSettings = serde_json::from_value(json!({
        "PreToolUse": [{"matcher": "", "hooks": [{"type": "command", "command": format!("sh {}", path.display()), "timeout": 60}]}]
    }))
    .unwrap();
    CommandHooks::new(&settings).unwrap()
}

async fn burst(gate: &Gate, tool: &str, args: Value) -> usize {
    let calls = (0..BURST).map(|_| gate.call(req(tool, args.clone(), script("burst"))));
    join_all(calls).await.iter().filter(|r| r.is_ok()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_count_rule_lets_exactly_two_of_fifty_parallel_calls_through() {
    let policy = PolicySet::parse(
        "p.cedar",
        r#"@id("all") permit(principal, action, resource);
           @id("two-per-script") forbid(principal, action, resource) when { context.script.calls >= 2 };"#,
    )
    .unwrap();
    for with_hook in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new();
        let tool = Arc::new(TestTool::new("t", object_schema()));
        reg.register(tool.clone()).unwrap();
        let mut b = Gate::builder().registry(reg).policy(policy.clone());
        if with_hook {
            b = b.command_hooks(slow_hook(dir.path()));
        }
        let gate = b.build().unwrap();
        let ok = burst(&gate, "t", json!({})).await;
        assert_eq!(ok, 2, "with hook: {with_hook}");
        assert_eq!(tool.runs.load(Ordering::SeqCst), 2);
        // Denied calls gave their reservations back: the script counts the two that ran.
        assert_eq!(gate.end_script("burst").calls, 2);
    }
}

fn image_model() -> TestTool {
    let mut t = TestTool::new(
        "models.generateImages",
        json!({"type": "object", "properties": {"text": {"type": "string"}}}),
    );
    t.spec.kind = CallKind::Model;
    t.usage = Some(Usage {
        images: 1,
        cost_usd: 0.04,
        ..Default::default()
    });
    t.delay_ms = 50;
    let facts = ModelFacts {
        provider: "p".into(),
        id: "painter".into(),
        model_type: "image".into(),
        image_price: 0.04,
        ..Default::default()
    };
    t.facts = Some(Box::new(move |_| {
        Ok(CallFacts {
            model: Some(facts.clone()),
            ..Default::default()
        })
    }));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cost_cap_holds_against_a_parallel_burst() {
    // Stop at ten cents: with four cents reserved per image, three calls fit under the cap.
    let policy = PolicySet::parse(
        "p.cedar",
        r#"@id("all") permit(principal, action, resource);
           @id("cap") forbid(principal, action == Action::"model_call", resource) when { context.session.cost_micro_usd >= 100000 };"#,
    )
    .unwrap();
    for with_hook in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new();
        let tool = Arc::new(image_model());
        reg.register(tool.clone()).unwrap();
        let mut b = Gate::builder().registry(reg).policy(policy.clone());
        if with_hook {
            b = b.command_hooks(slow_hook(dir.path()));
        }
        let gate = b.build().unwrap();
        let ok = burst(&gate, "models.generateImages", json!({"text": "a fox"})).await;
        assert_eq!(ok, 3, "with hook: {with_hook}");
        let spent = gate.session_totals("s1");
        assert!((spent.usage.cost_usd - 0.12).abs() < 1e-9, "{spent:?}");
        assert_eq!(spent.pending, Usage::default(), "estimates were settled");
    }
    // The same holds for a budget instead of a policy, and a budget is a ceiling: at $0.04 an
    // image, a third image would take the session to $0.12, past $0.10, so only two run.
    let reg = Registry::new();
    reg.register(Arc::new(image_model())).unwrap();
    let gate = builder(&reg)
        .budgets(serde_json::from_value(json!({"session": {"max_cost_usd": 0.1}})).unwrap())
        .build()
        .unwrap();
    assert_eq!(
        burst(&gate, "models.generateImages", json!({"text": "x"})).await,
        2
    );
    let spent = gate.session_totals("s1");
    assert!((spent.usage.cost_usd - 0.08).abs() < 1e-9, "{spent:?}");
}

async fn hook_answer(answer: &str) -> Result<(), codemode_gate::GateError> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("answer.txt");
    std::fs::write(&out, answer).unwrap();
    let cmd = format!("cat > /dev/null; cat {}", out.display());
    let settings: HookSettings = serde_json::from_value(json!({
        "PreToolUse": [{"matcher": "t", "hooks": [{"type": "command", "command": cmd}]}]
    }))
    .unwrap();
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("t", object_schema())))
        .unwrap();
    let gate = builder(&reg)
        .command_hooks(CommandHooks::new(&settings).unwrap())
        .build()
        .unwrap();
    gate.call(req("t", json!({}), script("h")))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn every_hook_answer_that_is_not_an_allow_blocks_and_names_the_hook() {
    let blocking = [
        r#"{"decision":"deny"}"#,
        r#"{"decision":"block","reason":"no"}"#,
        "42",
        "null",
        "[]",
        "true",
        r#""allow""#,
        r#"{"continue":"false"}"#,
        r#"{"continue":false}"#,
        "{}",
        r#"{"continue":true}"#,
        r#"{"decision":"maybe"}"#,
        r#"{"decision":"approve","surprise":1}"#,
        r#"{"hookSpecificOutput":{"permissionDecision":"allow","extra":1}}"#,
        r#"{"hookSpecificOutput":{"permissionDecision":"yes"}}"#,
        r#"{"hookSpecificOutput":{"permissionDecision":"deny"}}"#,
        r#"{"hookSpecificOutput":{"permissionDecision":"ask"}}"#,
        r#"{"decision":"approve"} trailing"#,
        "not json",
    ];
    for answer in blocking {
        let err = hook_answer(answer).await.expect_err(answer);
        // An "ask" with nobody to ask is refused at approval; everything else by the hook.
        assert!(
            matches!(err.stage, Stage::Hook | Stage::Approval),
            "{answer}: {}",
            err.message
        );
        assert!(
            err.message.contains("hook `cat > /dev/null"),
            "{answer}: the message does not name the hook: {}",
            err.message
        );
    }
    for answer in [
        "",
        "  \n",
        r#"{"decision":"approve"}"#,
        r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow"}}"#,
    ] {
        hook_answer(answer)
            .await
            .unwrap_or_else(|e| panic!("{answer:?}: {e}"));
    }
}

#[tokio::test]
async fn a_hooks_children_die_when_its_call_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("bg.pid");
    let script_path = dir.path().join("hang.sh");
    std::fs::write(
        &script_path,
        format!(
            "#!/bin/sh\nsleep 300 &\necho $! > {}\nsleep 300\n",
            pidfile.display()
        ),
    )
    .unwrap();
    let settings: HookSettings = serde_json::from_value(json!({
        "PreToolUse": [{"matcher": "", "hooks": [{"type": "command", "command": format!("sh {}", script_path.display()), "timeout": 600}]}]
    }))
    .unwrap();
    let reg = Registry::new();
    let tool = Arc::new(TestTool::new("t", object_schema()));
    reg.register(tool.clone()).unwrap();
    let gate = builder(&reg)
        .command_hooks(CommandHooks::new(&settings).unwrap())
        .build()
        .unwrap();
    let request = req("t", json!({}), script("c"));
    let cancel = request.cancel.clone();
    let call = tokio::spawn({
        let gate = gate.clone();
        async move { gate.call(request).await }
    });
    for _ in 0..200 {
        if pidfile.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    cancel.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert!(err.message.contains("cancelled"), "{}", err.message);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut alive = true;
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z") {
            alive = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive, "the hook's child {pid} outlived its cancelled call");
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn a_policy_template_is_refused_with_a_reason() {
    let text = r#"@id("fine") permit(principal, action, resource);
@id("no-secrets") forbid(principal, action, resource == ?resource);"#;
    let err = PolicySet::parse("t.cedar", text).unwrap_err();
    match &err {
        PolicyError::Template {
            line, policy_id, ..
        } => {
            assert_eq!(*line, 2);
            assert_eq!(policy_id, "no-secrets");
        }
        other => panic!("expected a template error, got {other}"),
    }
    assert!(err.to_string().contains("never apply"), "{err}");
    assert!(codemode_gate::check("t.cedar", text, &Registry::new()).is_err());
}

fn writer_and_reader(root: &Path) -> Registry {
    let reg = Registry::new();
    reg.register(Arc::new(
        TestTool::new("write", object_schema()).with_path_facts(root),
    ))
    .unwrap();
    let mut read = TestTool::new("read", object_schema()).with_path_facts(root);
    read.spec.annotations = Annotations {
        read_only_hint: Some(true),
        ..Default::default()
    };
    reg.register(Arc::new(read)).unwrap();
    reg
}

#[tokio::test]
async fn protected_paths_cannot_be_written_whatever_the_policy_permits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join(".codemode")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    let (log, log_path) = audit_in(&root);
    let gate = builder(&writer_and_reader(&root))
        .audit(log)
        .protect(ProtectedPath::new(
            root.join(".codemode"),
            "the project's codemode settings",
        ))
        .build()
        .unwrap();
    for path in [
        ".codemode/settings.json",
        ".codemode",
        "audit.jsonl",
        "audit.jsonl.head",
        "src/../.codemode/hooks.sh",
    ] {
        let err = gate
            .call(req("write", json!({"path": path}), script("p")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Protected, "{path}: {}", err.message);
    }
    gate.call(req(
        "read",
        json!({"path": ".codemode/settings.json"}),
        script("p"),
    ))
    .await
    .unwrap();
    gate.call(req("write", json!({"path": "src/main.rs"}), script("p")))
        .await
        .unwrap();
    let lines = audit_lines(&log_path);
    assert_eq!(lines[0]["stage"], "protected");
}

#[tokio::test]
async fn a_secret_path_is_refused_even_to_read_only_tools() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("state")).unwrap();
    std::fs::write(root.join("state/audit.key"), [7u8; 32]).unwrap();
    std::fs::write(root.join("state/cells.db"), "x").unwrap();
    std::os::unix::fs::symlink(root.join("state/audit.key"), root.join("k")).unwrap();
    let (log, log_path) = audit_in(&root);
    let gate = builder(&writer_and_reader(&root))
        .audit(log)
        .protect(ProtectedPath::new(root.join("state"), "codemode's state"))
        .protect(ProtectedPath::secret(
            root.join("state/audit.key"),
            "the audit log's key",
        ))
        .build()
        .unwrap();
    for path in ["state/audit.key", "k", "state/../state/audit.key"] {
        for tool in ["read", "write"] {
            let err = gate
                .call(req(tool, json!({"path": path}), script("p")))
                .await
                .unwrap_err();
            assert_eq!(
                err.stage,
                Stage::Protected,
                "{tool} {path}: {}",
                err.message
            );
            assert!(err.message.contains("read or change"), "{}", err.message);
        }
    }
    // The state directory's other files stay readable, not writable.
    gate.call(req("read", json!({"path": "state/cells.db"}), script("p")))
        .await
        .unwrap();
    let err = gate
        .call(req("write", json!({"path": "state/cells.db"}), script("p")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Protected);
    let lines = audit_lines(&log_path);
    assert_eq!(
        lines.iter().filter(|l| l["stage"] == "protected").count(),
        7,
        "every refusal is in the log"
    );
}

#[tokio::test]
async fn the_default_policy_reads_inside_the_workspace_and_asks_outside() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&root).unwrap();
    let gate = Gate::builder()
        .registry(writer_and_reader(&root))
        .workspace(&root)
        .build()
        .unwrap();
    gate.call(req("read", json!({"path": "notes.txt"}), script("w")))
        .await
        .unwrap();
    for outside in ["../other/notes.txt", "/etc/passwd"] {
        let err = gate
            .call(req("read", json!({"path": outside}), script("w")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Approval, "{outside}: {}", err.message);
        assert!(
            err.message.contains("outside the workspace"),
            "{}",
            err.message
        );
    }
    // With someone to ask, the read outside goes ahead once approved.
    let gate = Gate::builder()
        .registry(writer_and_reader(&root))
        .workspace(&root)
        .approver(FixedApprover::new(codemode_gate::ApprovalAnswer::Yes))
        .build()
        .unwrap();
    gate.call(req("read", json!({"path": "/etc/passwd"}), script("w")))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dropped_call_still_writes_its_one_outcome_line() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let mut slow = TestTool::new("slow", object_schema());
    slow.delay_ms = 60_000;
    let slow = Arc::new(slow);
    reg.register(slow.clone()).unwrap();
    let (log, path) = audit_in(dir.path());
    let gate = builder(&reg).audit(log).build().unwrap();
    let call = gate.call(req("slow", json!({}), script("d")));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["status"], "cancelled");
    assert_eq!(lines[0]["effect"], "unknown");
    assert_eq!(slow.runs.load(Ordering::SeqCst), 1);
    // A call dropped while a person is asked never ran: its reservation is given back.
    codemode_gate::verify(&path, Some(&test_key())).unwrap();
    assert_eq!(gate.end_script("d").calls, 1);
}

/// Red team: validating a huge argument against its schema ran past the script's deadline,
/// and the call still went out seconds after the script had stopped. A call cancelled while
/// it was admitted never runs, and its line says nothing happened.
#[tokio::test]
async fn a_call_cancelled_during_admission_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let tool = Arc::new(TestTool::new("t", object_schema()));
    reg.register(tool.clone()).unwrap();
    let (log, path) = audit_in(dir.path());
    let gate = builder(&reg).audit(log).build().unwrap();
    let request = req("t", json!({}), script("c"));
    let cancel = request.cancel.clone();
    let mut admitted = gate.admit(request).await.unwrap();
    cancel.cancel();
    let executed = admitted.execute().await;
    let err = admitted.finish(executed).await.unwrap_err();
    assert!(err.message.contains("cancelled"), "{}", err.message);
    assert_eq!(
        tool.runs.load(Ordering::SeqCst),
        0,
        "the cancelled call ran"
    );
    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["status"], "cancelled");
    assert_eq!(lines[0]["effect"], "none");
}

/// A workspace whose name is not UTF-8 (a Latin-1 `café`) is no text a path can start with:
/// its lossy spelling (`caf\u{FFFD}`) is another directory, outside it, which must not count
/// as inside. Tools refuse non-UTF-8 paths, so nothing counts as inside such a workspace.
#[tokio::test]
async fn a_directory_named_like_a_non_utf8_workspace_is_outside_it() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let parent = dir.path().canonicalize().unwrap();
    let root = parent.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir_all(&root).unwrap();
    let look_alike = parent.join("caf\u{FFFD}");
    std::fs::create_dir_all(&look_alike).unwrap();
    std::fs::write(look_alike.join("notes.txt"), "not in the workspace").unwrap();
    let gate = Gate::builder()
        .registry(writer_and_reader(&root))
        .workspace(&root)
        .build()
        .unwrap();
    let path = look_alike.join("notes.txt").display().to_string();
    let err = gate
        .call(req("read", json!({"path": path}), script("w")))
        .await
        .expect_err("a read outside the workspace ran without asking");
    assert_eq!(err.stage, Stage::Approval, "{}", err.message);
    assert!(
        err.message.contains("outside the workspace"),
        "{}",
        err.message
    );
}

/// A project may ship `.codemode` as a symlink whose target does not exist yet. Reading the
/// settings follows it, and so do the file tools (a write through a dangling symlink lands at
/// its target): the target is what must be protected, not the link's own name.
#[tokio::test]
async fn a_protected_path_that_is_a_dangling_symlink_protects_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("config")).unwrap();
    std::os::unix::fs::symlink("config/codemode", root.join(".codemode")).unwrap();
    // And one whose target is named through another dangling link, absolutely.
    std::os::unix::fs::symlink(root.join("elsewhere/state"), root.join("state-link")).unwrap();
    std::os::unix::fs::symlink(root.join("state-link/real"), root.join("state")).unwrap();
    let gate = builder(&writer_and_reader(&root))
        .protect(ProtectedPath::new(
            root.join(".codemode"),
            "the project's codemode settings",
        ))
        .protect(ProtectedPath::new(root.join("state"), "codemode's state"))
        .build()
        .unwrap();
    // What the file tools report for `.codemode/settings.json` and `state/x`: the targets.
    for path in [
        "config/codemode/settings.json",
        "config/codemode",
        "elsewhere/state/real/x",
    ] {
        let err = gate
            .call(req("write", json!({"path": path}), script("p")))
            .await
            .expect_err(path);
        assert_eq!(err.stage, Stage::Protected, "{path}: {}", err.message);
    }
    gate.call(req(
        "write",
        json!({"path": "config/other.json"}),
        script("p"),
    ))
    .await
    .unwrap();
}
