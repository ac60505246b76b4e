//! The real model tools behind the real gate, against a provider that lies about usage or is
//! cut off: the script's token budget still holds, and every call is in the audit log with what
//! it was charged.

mod common;

use std::time::Duration;

use codemode_gate::{
    AuditKey, AuditLog, BudgetLimits, Budgets, CallRequest, Gate, PolicySet, Registry, Stage,
};
use codemode_spec::Provenance;
use common::*;
use serde_json::{Value, json};

const TOKEN_BUDGET: u64 = 10_000;

fn gate_with(f: &Fixture, audit: Option<AuditLog>) -> Gate {
    let reg = Registry::new();
    reg.register(f.classify.clone()).unwrap();
    let policy = PolicySet::parse(
        "all.cedar",
        "@id(\"all\") permit(principal, action, resource);",
    )
    .unwrap();
    let budgets = Budgets {
        script: BudgetLimits {
            max_tokens: Some(TOKEN_BUDGET),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut b = Gate::builder()
        .registry(reg)
        .policy(policy)
        .budgets(budgets);
    if let Some(a) = audit {
        b = b.audit(a);
    }
    b.build().unwrap()
}

fn call(script_id: &str, n: usize) -> CallRequest {
    let mut p = Provenance::model(format!("cm-{script_id}/{n}"), "s1");
    p.origin = codemode_spec::Origin::Script;
    p.parent_call_id = Some(format!("cm-{script_id}"));
    p.depth = 1;
    p.script_id = Some(script_id.into());
    // 4,000 ASCII bytes of state: codemode counts at least 1,000 tokens for each call.
    let args = json!({"model": judge(), "context": {
        "state": { "text": "x".repeat(4000) },
        "questions": { "s": { "type": "choice", "instructions": "x", "criteria": { "a": "a", "b": "b" } } }
    }});
    CallRequest::new("models.classify", args, p)
}

/// Calls that ran and the tokens charged for them, checking every refusal is the budget's.
fn tally(results: Vec<Result<codemode_spec::ToolOutput, codemode_gate::GateError>>) -> usize {
    let mut ran = 0;
    for r in results {
        match r {
            Ok(out) => {
                assert!(out.usage.expect("usage").estimated);
                ran += 1;
            }
            Err(e) => {
                assert_eq!(e.stage, Stage::Budget, "{}", e.message);
                assert!(e.message.contains("max_tokens"), "{}", e.message);
            }
        }
    }
    ran
}

#[tokio::test]
async fn a_provider_that_reports_no_usage_cannot_spend_past_the_token_budget() {
    let f = fixture().await;
    f.provider.configure(|k| k.usage = None);
    let gate = gate_with(&f, None);

    // One after another: each call is charged codemode's count, so the budget runs out.
    let mut results = Vec::new();
    for n in 0..50 {
        results.push(gate.call(call("seq", n)).await);
    }
    let ran = tally(results);
    let used = gate.end_script("seq").usage.total_tokens();
    assert!(used <= TOKEN_BUDGET, "charged {used} of {TOKEN_BUDGET}");
    assert!((5..=9).contains(&ran), "{ran} calls ran");
    assert_eq!(
        f.provider.requests().len(),
        ran,
        "every request sent was a call that ran"
    );

    // All at once: reservations bound each call before it runs, so no burst overshoots.
    let calls = (0..50).map(|n| {
        let gate = gate.clone();
        tokio::spawn(async move { gate.call(call("burst", n)).await })
    });
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap());
    }
    let ran_burst = tally(results);
    let used = gate.end_script("burst").usage.total_tokens();
    assert!(
        used <= TOKEN_BUDGET,
        "charged {used} of {TOKEN_BUDGET} in a burst"
    );
    assert!(ran_burst >= 1, "the budget admits at least one call");
    assert_eq!(f.provider.requests().len(), ran + ran_burst);
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_model_call_cut_off_in_flight_is_audited_as_cancelled_and_charged_its_reservation() {
    let f = fixture().await;
    f.provider.configure(|k| k.delay = Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let audit = AuditLog::open_with_key(&path, AuditKey::from_bytes([7; 32])).unwrap();
    let gate = gate_with(&f, Some(audit));

    let req = call("cut", 0);
    let cancel = req.cancel.clone();
    let result = cancel_once_sent(&f.provider, cancel, gate.call(req)).await;
    let e = result.expect_err("a cancelled call is not a result");
    assert!(e.message.contains("cancel"), "{}", e.message);
    gate.flush().await;

    // The provider may bill a request it received: the call is charged as if it used all it
    // could, so a script cannot get free spend by cancelling its calls.
    let used = gate.end_script("cut").usage.total_tokens();
    assert!(used >= 4000, "charged {used}");
    let lines = audit_lines(&path);
    let line = lines
        .iter()
        .find(|l| l["tool"] == "models.classify")
        .expect("an audit line for the cancelled call");
    assert_eq!(line["status"], "cancelled", "{line}");
    assert_eq!(line["kind"], "model", "{line}");
}

/// A gate that permits everything, with the provider's catalog plus `tokpainter`, an image
/// model billed by tokens only (gpt-image-1 style), and a script cost cap of `cap` dollars.
fn token_priced_image_gate(provider: &codemode_models::testing::TestProvider, cap: f64) -> Gate {
    let mut models = catalog_json(&provider.base_url());
    models["models"].as_array_mut().unwrap().push(
        json!({ "provider": "p", "id": "tokpainter", "type": "image",
                "price": { "input": 5.0, "output": 40.0 } }),
    );
    let catalog = codemode_models::Catalog::from_json(&models).unwrap();
    let tools = codemode_models::model_tools(
        std::sync::Arc::new(catalog),
        codemode_models::ModelsHttpConfig::default(),
    );
    let reg = Registry::new();
    for t in tools {
        reg.register(t).unwrap();
    }
    Gate::builder()
        .registry(reg)
        .policy(
            PolicySet::parse(
                "all.cedar",
                "@id(\"all\") permit(principal, action, resource);",
            )
            .unwrap(),
        )
        .budgets(Budgets {
            script: BudgetLimits {
                max_cost_usd: Some(cap),
                ..Default::default()
            },
            ..Default::default()
        })
        .build()
        .unwrap()
}

/// Red team: an image model billed by tokens as well (gpt-image-1 is) was reserved only its
/// price per image, so four parallel calls passed a $1.50 cap together and spent $4. The
/// reservation now holds its token prices too, at 6,240 output tokens an image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_image_calls_priced_by_tokens_stay_under_a_cost_cap() {
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    provider.configure(|k| {
        k.delay = Duration::from_millis(300);
        k.usage = Some((10, 4_000));
    });
    let cap = 0.6;
    let gate = token_priced_image_gate(&provider, cap);
    let calls = (0..4).map(|n| {
        let gate = gate.clone();
        async move {
            let mut p = Provenance::model(format!("cm-img/{n}"), "s1");
            p.origin = codemode_spec::Origin::Script;
            p.script_id = Some("img".into());
            let args = json!({"model": { "type": "image", "provider": "p", "id": "tokpainter" },
                              "context": {"input": [{"type": "text", "text": "a fox"}]}});
            gate.call(CallRequest::new("models.generateImages", args, p))
                .await
        }
    });
    let results = futures::future::join_all(calls).await;
    let ran = results.iter().filter(|r| r.is_ok()).count();
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.stage, Stage::Budget, "{}", e.message);
        }
    }
    let spent = gate.end_script("img").usage.cost_usd;
    // Each call costs $0.16005 (10 input and 4,000 output tokens).
    assert!(ran >= 1, "{results:?}");
    assert!(
        spent <= cap,
        "spent ${spent} against a cap of ${cap}, {ran} calls ran"
    );
}

/// Red team: an image model billed by tokens (gpt-image-1 style, no price per image) was
/// charged only the tokens its provider reported. A provider that reported none, or zero,
/// made every image free: one call after another all passed a cost cap that allows two.
/// Codemode's own count stands in for a missing report, as for classify calls.
#[tokio::test]
async fn image_calls_priced_by_tokens_are_not_free_when_the_provider_reports_no_usage() {
    type SetKnobs = Box<dyn Fn(&mut codemode_models::testing::Knobs)>;
    let cases: [(&str, SetKnobs); 2] = [
        ("missing", Box::new(|k| k.usage = None)),
        ("zero", Box::new(|k| k.usage = Some((0, 0)))),
    ];
    for (name, knob) in cases {
        let provider = codemode_models::testing::TestProvider::start()
            .await
            .unwrap();
        provider.configure(|k| knob(k));
        // Room for two images at the reserved 6,240 output tokens ($0.25 each).
        let cap = 0.6;
        let gate = token_priced_image_gate(&provider, cap);
        let mut ran = 0;
        for n in 0..10 {
            let mut p = Provenance::model(format!("cm-img/{n}"), "s1");
            p.origin = codemode_spec::Origin::Script;
            p.script_id = Some("img".into());
            let args = json!({"model": { "type": "image", "provider": "p", "id": "tokpainter" },
                              "context": {"input": [{"type": "text", "text": "a fox"}]}});
            match gate
                .call(CallRequest::new("models.generateImages", args, p))
                .await
            {
                Ok(out) => {
                    assert_eq!(out.value["stopReason"], "stop", "{name}: {}", out.value);
                    let usage = out.usage.expect("usage");
                    assert!(usage.estimated, "{name}: {usage:?}");
                    assert!(usage.cost_usd > 0.0, "{name}: an image came free");
                    ran += 1;
                }
                Err(e) => assert_eq!(e.stage, Stage::Budget, "{name}: {}", e.message),
            }
        }
        let spent = gate.end_script("img").usage.cost_usd;
        assert!(ran <= 2, "{name}: {ran} images ran under a cap of ${cap}");
        assert!(spent > 0.0 && spent <= cap, "{name}: spent ${spent}");
    }
}
