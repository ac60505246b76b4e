//! The gate's typed inputs that are not policy: model rules and the nesting limit.

use crate::common;

use std::sync::Arc;

use codemode_gate::{ModelRules, Registry, Stage};
use codemode_spec::Provenance;
use common::*;
use serde_json::json;

#[tokio::test]
async fn models_allow_list_is_enforced_by_the_gate() {
    let reg = Registry::new();
    for (name, id) in [("models.a", "small"), ("models.b", "big")] {
        reg.register(Arc::new(TestTool::model(
            name,
            "acme",
            id,
            Default::default(),
        )))
        .unwrap();
    }
    let gate = builder(&reg)
        .models(ModelRules {
            enabled: None,
            allow: Some(vec!["acme/small".into()]),
        })
        .build()
        .unwrap();
    gate.call(req("models.a", json!({"text": "x"}), script("m")))
        .await
        .unwrap();
    let err = gate
        .call(req("models.b", json!({"text": "x"}), script("m")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert!(
        err.message.contains("`acme/big` is not in `models.allow`"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn calls_nested_deeper_than_max_depth_are_refused() {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("read", object_schema()).read_only()))
        .unwrap();
    let gate = builder(&reg).max_depth(Some(1)).build().unwrap();
    gate.call(req("read", json!({}), script("d")))
        .await
        .unwrap();
    let mut deep: Provenance = script("d");
    deep.depth = 2;
    let err = gate.call(req("read", json!({}), deep)).await.unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(err.message.contains("limits.max_depth"), "{}", err.message);
}
