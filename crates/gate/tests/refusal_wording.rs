//! Every refusal reads the same way to the model: what happened, whether a person was asked,
//! and what it can do next; the `stage` says which step refused.

use crate::common;

use std::sync::Arc;

use codemode_gate::{
    ApprovalAnswer, BudgetLimits, Budgets, Gate, GateError, Hook, HookDecision, HookEvent,
    PolicySet, ProtectedPath, Registry, Stage,
};
use codemode_spec::{BoxFuture, CodemodeMode, Exposure};
use common::*;
use serde_json::json;

struct Deny;
impl Hook for Deny {
    fn before<'a>(&'a self, _ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        Box::pin(async { HookDecision::Deny("not on Fridays".into()) })
    }
}

/// Says whether a person was asked, and names a next step.
fn check(err: &GateError, stage: Stage, asked: bool) {
    let m = &err.message;
    assert_eq!(err.stage, stage, "{m}");
    if asked {
        assert!(m.contains("the user was asked"), "{stage:?}: {m}");
    } else {
        assert!(m.contains("No person was asked"), "{stage:?}: {m}");
    }
    let next = [
        "Do not retry",
        "ask the user",
        "Call it from a script",
        "Call the tools",
        "Use ",
        "Do the rest",
        "Tell the user",
        "Make the call",
    ];
    assert!(
        next.iter().any(|n| m.contains(n)),
        "{stage:?}: no next step in {m}"
    );
}

fn tools(root: &std::path::Path) -> Registry {
    let reg = Registry::new();
    reg.register(Arc::new(
        TestTool::new("write", object_schema()).with_path_facts(root),
    ))
    .unwrap();
    reg.register(Arc::new(
        TestTool::new("secret", object_schema()).exposure(Exposure::Hidden),
    ))
    .unwrap();
    reg.register(Arc::new(TestTool::new("read", object_schema()).read_only()))
        .unwrap();
    reg
}

#[tokio::test]
async fn every_refusal_says_whether_a_person_was_asked_and_what_to_do_next() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let reg = tools(&root);
    let write = || req("write", json!({"path": "a.txt"}), script("w"));

    let open = builder(&reg).build().unwrap();
    let err = open
        .call(req("secret", json!({}), script("w")))
        .await
        .unwrap_err();
    check(&err, Stage::Resolve, false);

    let only = builder(&reg).mode(CodemodeMode::Only).build().unwrap();
    let err = only
        .call(req("read", json!({}), model_origin()))
        .await
        .unwrap_err();
    check(&err, Stage::Resolve, false);

    let depth = builder(&reg).max_depth(Some(0)).build().unwrap();
    check(
        &depth.call(write()).await.unwrap_err(),
        Stage::Resolve,
        false,
    );

    let forbid = PolicySet::parse(
        "p.cedar",
        "@id(\"all\") permit(principal, action, resource);\n@id(\"no-writes\") forbid(principal, action, resource == Tool::\"write\");",
    )
    .unwrap();
    let gate = Gate::builder()
        .registry(reg.clone())
        .policy(forbid)
        .build()
        .unwrap();
    let err = gate.call(write()).await.unwrap_err();
    check(&err, Stage::Policy, false);
    assert!(err.message.contains("`no-writes`"), "{}", err.message);

    let reads_only = PolicySet::parse(
        "p.cedar",
        "@id(\"reads\") permit(principal, action, resource == Tool::\"read\");",
    )
    .unwrap();
    let gate = Gate::builder()
        .registry(reg.clone())
        .policy(reads_only)
        .build()
        .unwrap();
    check(&gate.call(write()).await.unwrap_err(), Stage::Policy, false);

    let hooked = builder(&reg).hook(Arc::new(Deny)).build().unwrap();
    let err = hooked.call(write()).await.unwrap_err();
    check(&err, Stage::Hook, false);
    assert!(err.message.contains("not on Fridays"), "{}", err.message);

    // The default policy asks before writes.
    let nobody = Gate::builder().registry(reg.clone()).build().unwrap();
    check(
        &nobody.call(write()).await.unwrap_err(),
        Stage::Approval,
        false,
    );
    let said_no = Gate::builder()
        .registry(reg.clone())
        .approver(FixedApprover::new(ApprovalAnswer::No))
        .build()
        .unwrap();
    check(
        &said_no.call(write()).await.unwrap_err(),
        Stage::Approval,
        true,
    );

    let budgets = Budgets {
        script: BudgetLimits {
            max_calls: Some(1),
            ..Default::default()
        },
        ..Default::default()
    };
    let counted = builder(&reg).budgets(budgets).build().unwrap();
    counted.call(write()).await.unwrap();
    check(
        &counted.call(write()).await.unwrap_err(),
        Stage::Budget,
        false,
    );

    let protected = builder(&reg)
        .protect(ProtectedPath::new(&root, "the project's codemode settings"))
        .build()
        .unwrap();
    check(
        &protected.call(write()).await.unwrap_err(),
        Stage::Protected,
        false,
    );
}
