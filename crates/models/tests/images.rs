//! models.generateImages against the loopback provider.

mod common;

use codemode_models::image_count;
use codemode_models::testing::TINY_PNG_BASE64;
use codemode_spec::ToolErrorKind;
use common::*;
use serde_json::json;

#[tokio::test]
async fn generates_image_blocks_with_detected_type_and_cost() {
    let f = fixture().await;
    f.provider.configure(|k| k.usage = None);
    let args = json!({"model": painter(), "context": {"input": [{"type": "text", "text": "a red fox"}, {"type": "text", "text": "in snow"}]}});
    let out = gated(&f.images, args).await.unwrap();
    let v = &out.value;
    assert_eq!(v["stopReason"], "stop", "{v}");
    assert_eq!(
        (v["provider"].as_str(), v["model"].as_str()),
        (Some("p"), Some("painter"))
    );
    assert_eq!(
        v["output"],
        json!([{ "type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png" }])
    );
    assert_eq!(image_count(v), 1);
    let usage = out.usage.unwrap();
    assert_eq!(usage.images, 1);
    assert!((usage.cost_usd - 0.04).abs() < 1e-12);

    let seen = f.provider.requests();
    assert_eq!(seen[0].path, "/v1/images/generations");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(
        seen[0].body,
        json!({"model": "painter", "prompt": "a red fox\n\nin snow", "n": 1, "response_format": "b64_json"})
    );
}

#[tokio::test]
async fn bad_image_contexts_are_refused_before_any_request() {
    let f = fixture().await;
    let cases = [
        (
            json!({"prompt": "x"}),
            "context.input to be a non-empty array of blocks, but got null",
        ),
        (json!({"input": []}), "but got an empty array"),
        (json!("fox"), "but got a context of a string"),
        (
            json!({"input": [{"type": "audio"}]}),
            "context.input[0] to be a text or image block",
        ),
        (
            json!({"input": [{"type": "text", "text": 5}]}),
            "context.input[0] to be a text block",
        ),
        (
            json!({"input": [{"type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png"}]}),
            "at least one text block",
        ),
        (
            json!({"input": [{"type": "text", "text": "x"}, {"type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png"}]}),
            "takes a text prompt only",
        ),
    ];
    for (context, expected) in cases {
        let err = f
            .images
            .facts(&json!({"model": painter(), "context": context}))
            .unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
        assert!(
            err.message.contains(expected),
            "expected {expected:?} in {:?}",
            err.message
        );
        assert!(
            err.message
                .contains("Expected context: { input: [{ type: \"text\", text: <prompt> }"),
            "{}",
            err.message
        );
    }
    let err = f
        .images
        .facts(&json!({"model": judge(), "context": {"input": [{"type": "text", "text": "x"}]}}))
        .unwrap_err();
    assert!(err.message.contains("is a classifier model, so models.generateImages() cannot use it; it needs an image model"), "{}", err.message);
    assert!(
        err.message.contains("getAvailableOfType(\"image\")"),
        "{}",
        err.message
    );
    assert!(f.provider.requests().is_empty());
}
