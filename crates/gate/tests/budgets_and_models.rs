//! Budgets and model calls: race-free reservations, cost and token limits, every refusal audited.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use codemode_gate::{
    BudgetLimits, Budgets, Gate, Hook, HookDecision, HookEvent, PolicySet, Registry, Stage,
};
use codemode_spec::{BoxFuture, Usage};
use common::*;
use serde_json::json;

fn usage(tokens: u64, cost: f64) -> Usage {
    Usage {
        input_tokens: tokens / 2,
        output_tokens: tokens - tokens / 2,
        images: 0,
        cost_usd: cost,
        ..Default::default()
    }
}

fn model_policy() -> PolicySet {
    PolicySet::parse(
        "models.cedar",
        r#"@id("models") permit(principal, action == Action::"model_call", resource is Model);
@id("tools") permit(principal, action == Action::"tool_call", resource);
@id("no-expensive") forbid(principal, action == Action::"model_call", resource == Model::"acme/big")
  when { resource.input_price.greaterThan(decimal("0.1")) };
"#,
    )
    .unwrap()
}

/// A gate holding one model tool under the test's model policy and `budgets`.
fn model_gate(tool: TestTool, budgets: Budgets) -> Gate {
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    Gate::builder()
        .registry(reg)
        .policy(model_policy())
        .budgets(budgets)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_model_calls_with_a_budget_of_ten_run_exactly_ten() {
    let mut tool = TestTool::model("models.classify", "acme", "small", usage(10, 0.0));
    tool.delay_ms = 5;
    let runs = tool.runs.clone();
    let budgets = Budgets {
        script: BudgetLimits {
            max_model_calls: Some(10),
            ..Default::default()
        },
        ..Default::default()
    };
    let gate = model_gate(tool, budgets);
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            gate.call(req(
                "models.classify",
                json!({"text": "hi"}),
                script("race"),
            ))
            .await
        }));
    }
    let mut ok = 0;
    let mut denied = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.stage, Stage::Budget);
                assert!(e.message.contains("max_model_calls"), "{}", e.message);
                assert!(e.message.contains("10 used of 10"), "{}", e.message);
                denied += 1;
            }
        }
    }
    assert_eq!((ok, denied), (10, 990));
    assert_eq!(runs.load(Ordering::SeqCst), 10);
    let used = gate.end_script("race");
    assert_eq!(used.model_calls, 10);
    assert_eq!(used.usage.total_tokens(), 100);
    assert_eq!(used.records.len(), 1000);
}

#[tokio::test]
async fn model_call_forbidden_by_policy_on_the_model_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (audit, path) = audit_in(dir.path());
    let big = TestTool::model("models.big", "acme", "big", usage(10, 0.01));
    let big_runs = big.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(big)).unwrap();
    let gate = Gate::builder()
        .registry(reg)
        .policy(model_policy())
        .audit(audit)
        .build()
        .unwrap();
    let err = gate
        .call(req("models.big", json!({"text": "x"}), script("m")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert_eq!(err.policy_ids, ["no-expensive"]);
    assert!(err.message.contains("acme/big"), "{}", err.message);
    assert_eq!(big_runs.load(Ordering::SeqCst), 0);
    let line = &audit_lines(&path)[0];
    assert_eq!(line["tool"], "models.big");
    assert_eq!(line["kind"], "model");
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["policy_ids"], json!(["no-expensive"]));
    assert_eq!(line["status"], "denied");
    assert_eq!(line["stage"], "policy");
}

struct DenyModels;
impl Hook for DenyModels {
    fn before<'a>(&'a self, ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        let d = if ev.kind == codemode_spec::CallKind::Model {
            HookDecision::Deny("no model spend in CI".into())
        } else {
            HookDecision::Allow
        };
        Box::pin(async move { d })
    }
}

#[tokio::test]
async fn model_call_stopped_by_a_hook_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (audit, path) = audit_in(dir.path());
    let tool = TestTool::model("models.classify", "acme", "small", usage(10, 0.001));
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = Gate::builder()
        .registry(reg)
        .policy(model_policy())
        .hook(Arc::new(DenyModels))
        .audit(audit)
        .build()
        .unwrap();
    let err = gate
        .call(req("models.classify", json!({"text": "x"}), script("m")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Hook);
    assert!(err.message.contains("no model spend in CI"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let line = &audit_lines(&path)[0];
    assert_eq!(line["kind"], "model");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["stage"], "hook");
    assert_eq!(line["status"], "denied");
}

#[tokio::test]
async fn spent_cost_and_token_budgets_deny_further_model_calls_and_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (audit, path) = audit_in(dir.path());
    let tool = TestTool::model("models.classify", "acme", "small", usage(100, 0.006));
    let runs = tool.runs.clone();
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    reg.register(Arc::new(TestTool::new("read", object_schema())))
        .unwrap();
    let budgets = Budgets {
        script: BudgetLimits {
            max_cost_usd: Some(0.01),
            ..Default::default()
        },
        session: BudgetLimits {
            max_tokens: Some(300),
            ..Default::default()
        },
    };
    let gate = Gate::builder()
        .registry(reg)
        .policy(model_policy())
        .budgets(budgets)
        .audit(audit)
        .build()
        .unwrap();
    let call = |sid: &'static str| {
        let gate = gate.clone();
        async move {
            gate.call(req("models.classify", json!({"text": "x"}), script(sid)))
                .await
        }
    };
    call("a").await.unwrap();
    call("a").await.unwrap(); // 0.006 < 0.01 before this call; 0.012 after
    let err = call("a").await.unwrap_err();
    assert_eq!(err.stage, Stage::Budget);
    assert!(
        err.message.contains("script budget `max_cost_usd`"),
        "{}",
        err.message
    );
    assert!(err.message.contains("$0.012"), "{}", err.message);
    // Tool calls do not spend model budgets.
    gate.call(req("read", json!({}), script("a")))
        .await
        .unwrap();

    // A new script has a fresh cost budget, but the session has spent 200 of 300 tokens.
    call("b").await.unwrap();
    let err = call("b").await.unwrap_err();
    assert!(
        err.message.contains("session budget `max_tokens`"),
        "{}",
        err.message
    );
    assert!(err.message.contains("300 used of 300"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let totals = gate.session_totals("s1");
    assert_eq!(totals.model_calls, 3);
    assert_eq!(totals.calls, 4);
    assert_eq!(totals.usage.total_tokens(), 300);
    assert!((totals.usage.cost_usd - 0.018).abs() < 1e-9);
    let a = gate.end_script("a");
    assert_eq!(a.records.iter().filter(|r| r.usage.is_some()).count(), 2);
    assert_eq!(a.records[2].status, codemode_gate::Status::Denied);
    assert_eq!(a.records[2].stage, Some(codemode_gate::Stage::Budget));

    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 6);
    let budget_lines: Vec<_> = lines.iter().filter(|l| l["stage"] == "budget").collect();
    assert_eq!(budget_lines.len(), 2);
    assert!(budget_lines.iter().all(|l| l["kind"] == "model"));
    assert_eq!(lines[0]["usage"]["costUsd"], json!(0.006));
    codemode_gate::verify(&path, Some(&common::test_key())).unwrap();
}

#[tokio::test]
async fn call_and_byte_budgets_per_script_and_session() {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("t", object_schema())))
        .unwrap();
    let budgets = Budgets {
        script: BudgetLimits {
            max_calls: Some(2),
            ..Default::default()
        },
        session: BudgetLimits {
            max_bytes: Some(100),
            ..Default::default()
        },
    };
    let gate = builder(&reg).budgets(budgets).build().unwrap();
    let call = |sid: &'static str, path: &str| {
        let gate = gate.clone();
        let args = json!({"path": path});
        async move { gate.call(req("t", args, script(sid))).await }
    };
    call("x", "a").await.unwrap();
    call("x", "a").await.unwrap();
    let err = call("x", "a").await.unwrap_err();
    assert!(
        err.message.contains("script budget `max_calls`") && err.message.contains("2 used of 2"),
        "{}",
        err.message
    );
    // Each result is 21 bytes ({"echo":{"path":"a"}}); the session allows 100.
    call("y", "a").await.unwrap();
    call("y", "a").await.unwrap();
    let err = call("z", &"long".repeat(20)).await.unwrap_err();
    assert_eq!(err.stage, Stage::Budget);
    assert!(
        err.message.contains("session budget `max_bytes`"),
        "{}",
        err.message
    );
    assert!(err.message.contains("withheld"), "{}", err.message);
    let err = call("z", "a").await.unwrap_err();
    assert!(err.message.contains("max_bytes"), "{}", err.message);
}

#[tokio::test]
async fn a_model_tool_without_model_facts_is_denied() {
    let mut tool = TestTool::model("models.x", "acme", "small", usage(1, 0.0));
    tool.facts = None;
    let reg = Registry::new();
    reg.register(Arc::new(tool)).unwrap();
    let gate = Gate::builder()
        .registry(reg)
        .policy(model_policy())
        .build()
        .unwrap();
    let err = gate
        .call(req("models.x", json!({"text": "x"}), script("m")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert!(
        err.message.contains("did not say which model"),
        "{}",
        err.message
    );
}

/// Red-team finding: a provider reporting `u64::MAX` input tokens wrapped the total to 49, and
/// a 1,000-token budget let every later call through. Counts saturate instead.
#[tokio::test]
async fn an_absurd_token_count_exhausts_the_budget_instead_of_wrapping_it() {
    let lying = Usage {
        input_tokens: u64::MAX,
        output_tokens: 50,
        ..Default::default()
    };
    let tool = TestTool::model("models.classify", "acme", "small", lying);
    let runs = tool.runs.clone();
    let budgets = Budgets {
        session: BudgetLimits {
            max_tokens: Some(1000),
            ..Default::default()
        },
        ..Default::default()
    };
    let gate = model_gate(tool, budgets);
    let call = || gate.call(req("models.classify", json!({"text": "x"}), script("a")));
    call().await.unwrap();
    for _ in 0..5 {
        let err = call().await.unwrap_err();
        assert_eq!(err.stage, Stage::Budget, "{}", err.message);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(gate.session_totals("s1").usage.total_tokens(), u64::MAX);
}

/// Red team: every call's record stayed in memory until its script ended, a kilobyte or two
/// each: 40,000 refused calls grew the host by 140 MB, 350 MB at the default 100,000 calls.
/// A script keeps its most recent records only, and says how many it let go.
#[tokio::test]
async fn a_script_keeps_a_bounded_number_of_call_records() {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("t", object_schema())))
        .unwrap();
    let gate = builder(&reg).build().unwrap();
    let total = 2 * codemode_gate::KEPT_RECORDS + 500;
    let mut last = None;
    for i in 0..total {
        let mut r = req("t", json!({"path": format!("p{i}")}), script("many"));
        r.provenance.seq = Some(i as u64);
        last = Some(r.provenance.call_id.clone());
        gate.call(r).await.unwrap();
    }
    let ended = gate.end_script("many");
    assert_eq!(ended.calls, total as u64);
    assert!(
        ended.records.len() <= 2 * codemode_gate::KEPT_RECORDS,
        "{} records kept",
        ended.records.len()
    );
    assert_eq!(
        ended.records.len() as u64 + ended.records_dropped,
        total as u64
    );
    // The newest are the ones kept.
    assert_eq!(
        ended.records.last().map(|r| r.provenance.call_id.clone()),
        last
    );
}
