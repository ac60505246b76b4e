mod common;
use common::*;
use serde_json::json;

async fn returns_values_and_calls_tools() {
    assert_eq!(value("return 1").await, json!(1));
    assert_eq!(
        value("return { a: 1, b: [true, 'x'] }").await,
        json!({"a": 1, "b": [true, "x"]})
    );
    let r = run("").await;
    assert!(!r.ok);
    let r = run("return undefined").await;
    assert!(r.ok && r.value.is_none());
    assert_eq!(
        value("return await tools.echo({ i: 3 })").await,
        json!({"i": 3})
    );
    assert_eq!(
        value(
            "let s = 0; for (let i = 0; i < 100; i++) s += (await tools.echo({ i })).i; return s"
        )
        .await,
        json!(4950)
    );
    healthy().await;
}

both_modes!(returns_values_and_calls_tools);
