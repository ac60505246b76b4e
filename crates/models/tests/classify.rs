//! models.classify against the loopback provider: answers from log-probabilities, usage, what
//! the provider sees, and inputs refused before any request.

mod common;

use codemode_models::testing::TINY_PNG_BASE64;
use codemode_spec::{CallKind, ToolErrorKind};
use common::*;
use serde_json::{Value, json};

fn close(a: &Value, b: f64) {
    let a = a.as_f64().unwrap_or_else(|| panic!("not a number: {a}"));
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[tokio::test]
async fn choice_score_and_bool_come_from_logprobs_in_one_request() {
    let f = fixture().await;
    f.provider.configure(|k| {
        k.label_probs = vec![
            vec![0.1, 0.6, 0.3],
            vec![0.1, 0.2, 0.3, 0.4],
            vec![0.8, 0.2],
        ];
    });
    let args = json!({
        "model": judge(),
        "context": {
            "state": { "review": "meh" },
            "questions": {
                "sentiment": { "type": "choice", "instructions": "Feeling?", "criteria": { "positive": "likes", "negative": "dislikes", "neutral": "neither" } },
                "quality": { "type": "score", "instructions": "How good?", "criteria": ["bad", "ok", "good", "great"] },
                "spam": { "type": "bool", "instructions": "Is it spam?", "criteria": { "true": "spam", "false": "not spam" } }
            }
        }
    });
    let out = gated(&f.classify, args).await.unwrap();
    let v = &out.value;
    assert_eq!(v["stopReason"], "stop", "{v}");
    assert_eq!(v["provider"], "p");
    assert_eq!(v["model"], "judge");
    let s = &v["answers"]["sentiment"];
    assert_eq!(s["type"], "choice");
    assert_eq!(s["choice"], "negative");
    close(&s["probabilities"]["positive"], 0.1);
    close(&s["probabilities"]["negative"], 0.6);
    close(&s["probabilities"]["neutral"], 0.3);
    close(&s["confidence"], 0.6);
    let q = &v["answers"]["quality"];
    assert_eq!(q["type"], "score");
    // Expected level (0*0.1 + 1*0.2 + 2*0.3 + 3*0.4) = 2.0 on a 0..3 scale.
    close(&q["score"], 2.0 / 3.0);
    close(&q["confidence"], 0.4);
    assert_eq!(q["level"], "great");
    let b = &v["answers"]["spam"];
    assert_eq!(b["type"], "bool");
    close(&b["probability"], 0.8);
    assert_eq!(
        f.provider.requests().len(),
        1,
        "one request answers every question"
    );

    // Usage: 100 input and 10 output tokens at $1 and $4 per million.
    let usage = out.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (100, 10));
    assert!((usage.cost_usd - 0.00014).abs() < 1e-12);
    assert_eq!(v["usage"]["inputTokens"], 100);
    close(&v["usage"]["costUsd"], 0.00014);
}

#[tokio::test]
async fn provider_sees_catalog_url_key_headers_and_a_constrained_request() {
    let f = fixture().await;
    f.classify
        .facts(&json!({"model": judge(), "context": one_choice_question()}))
        .unwrap();
    gated(
        &f.classify,
        json!({"model": judge(), "context": one_choice_question()}),
    )
    .await
    .unwrap();
    let seen = f.provider.requests();
    let r = &seen[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(
        r.headers
            .contains(&("x-org".to_string(), "acme".to_string()))
    );
    assert_eq!(r.body["model"], "judge");
    assert_eq!(r.body["logprobs"], true);
    assert_eq!(r.body["top_logprobs"], 20);
    let schema = &r.body["response_format"]["json_schema"]["schema"];
    assert_eq!(schema["properties"]["q1"]["enum"], json!(["A", "B", "C"]));
    let prompt = r.body["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("I love it") && prompt.contains("A = positive: likes it"),
        "{prompt}"
    );
}

#[tokio::test]
async fn script_supplied_url_headers_and_key_are_ignored() {
    let f = fixture().await;
    let model = json!({
        "type": "classifier", "provider": "p", "id": "judge",
        "baseUrl": "http://127.0.0.2:1/v1", "headers": { "Authorization": "Bearer evil" }, "apiKey": "evil"
    });
    let out = gated(
        &f.classify,
        json!({"model": model, "context": one_choice_question()}),
    )
    .await
    .unwrap();
    assert_eq!(out.value["stopReason"], "stop", "{}", out.value);
    let seen = f.provider.requests();
    assert_eq!(seen.len(), 1, "the catalog's provider got the call");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!seen[0].headers.iter().any(|(_, v)| v.contains("evil")));
}

#[tokio::test]
async fn facts_name_the_model_for_the_gate() {
    let f = fixture().await;
    assert_eq!(f.classify.spec().kind, CallKind::Model);
    assert_eq!(f.images.spec().kind, CallKind::Model);
    let facts = f
        .classify
        .facts(&json!({"model": judge(), "context": one_choice_question()}))
        .unwrap();
    let m = facts.model.unwrap();
    assert_eq!(
        (m.provider.as_str(), m.id.as_str(), m.model_type.as_str()),
        ("p", "judge", "classifier")
    );
    assert_eq!((m.input_price, m.output_price), (1.0, 4.0));
    let facts = f
        .images
        .facts(
            &json!({"model": painter(), "context": {"input": [{"type": "text", "text": "fox"}]}}),
        )
        .unwrap();
    assert_eq!(facts.model.unwrap().image_price, 0.04);
}

#[tokio::test]
async fn without_logprobs_the_chosen_label_gets_all_the_probability() {
    let f = fixture().await;
    f.provider.configure(|k| {
        k.omit_logprobs = true;
        k.label_probs = vec![vec![0.2, 0.7, 0.1]];
    });
    let out = gated(
        &f.classify,
        json!({"model": judge(), "context": one_choice_question()}),
    )
    .await
    .unwrap();
    let s = &out.value["answers"]["sentiment"];
    assert_eq!(s["choice"], "negative");
    close(&s["probabilities"]["negative"], 1.0);
    close(&s["probabilities"]["positive"], 0.0);
}

#[tokio::test]
async fn images_go_to_a_classifier_that_takes_them() {
    let f = fixture().await;
    let mut context = one_choice_question();
    context["images"] =
        json!([{ "type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/jpeg" }]);
    let model = json!({"provider": "p", "id": "seer"});
    let out = gated(&f.classify, json!({"model": model, "context": context}))
        .await
        .unwrap();
    assert_eq!(out.value["stopReason"], "stop");
    let content = &f.provider.requests()[0].body["messages"][1]["content"];
    let url = content[1]["image_url"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("data:image/png;base64,iVBOR"),
        "the type comes from the bytes: {url}"
    );
}

/// Each case is refused by `facts` and by `call`, and the provider never hears of it.
#[tokio::test]
async fn bad_input_is_refused_before_any_request() {
    let f = fixture().await;
    let q = one_choice_question();
    let with = |key: &str, value: Value| {
        let mut c = q.clone();
        c[key] = value;
        c
    };
    let question = |value: Value| with("questions", json!({ "x": value }));
    let png = json!({ "type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png" });
    let cases: Vec<(Value, Value, &str)> = vec![
        (
            json!("judge"),
            q.clone(),
            "needs a classifier model as its first argument (an entry with string provider and id), but got a string",
        ),
        (
            Value::Null,
            q.clone(),
            "got null. models.getModelOfType() gives undefined",
        ),
        (json!({"provider": "p"}), q.clone(), "but got { provider }"),
        (
            json!({"provider": "p", "id": "nope"}),
            q.clone(),
            "no classifier model \"p/nope\"",
        ),
        (painter(), q.clone(), "\"p/painter\" is an image model"),
        (
            json!({"provider": "p", "id": "talker"}),
            q.clone(),
            "\"p/talker\" is a chat model",
        ),
        (
            judge(),
            json!("text"),
            "needs a context object as its second argument, but got a string",
        ),
        (
            judge(),
            with("state", json!([1])),
            "context.state to be an object, but got an array",
        ),
        (
            judge(),
            json!({"questions": q["questions"]}),
            "context.state to be an object, but got null",
        ),
        (
            judge(),
            with("questions", json!({})),
            "context.questions to map question ids to questions (at least one), but got {}",
        ),
        (
            judge(),
            with("questions", json!([])),
            "but got an empty array",
        ),
        (
            judge(),
            question(json!("why?")),
            "context.questions.x to be a question object",
        ),
        (
            judge(),
            question(json!({"type": "choice", "criteria": {"a": "b"}})),
            "context.questions.x.instructions to be a string",
        ),
        (
            judge(),
            question(json!({"type": "choice", "instructions": "i", "criteria": {}})),
            "\"choice\" question, so context.questions.x.criteria must map each label",
        ),
        (
            judge(),
            question(json!({"type": "choice", "instructions": "i", "criteria": {"a": 1}})),
            "must map each label",
        ),
        (
            judge(),
            question(json!({"type": "score", "instructions": "i", "criteria": ["only"]})),
            "\"score\" question, so context.questions.x.criteria must list at least two levels",
        ),
        (
            judge(),
            question(
                json!({"type": "score", "instructions": "i", "criteria": ["0","1","2","3","4","5","6","7","8","9","10"]}),
            ),
            "at most 10",
        ),
        (
            judge(),
            question(
                json!({"type": "bool", "instructions": "i", "criteria": {"yes": "a", "no": "b"}}),
            ),
            "\"bool\" question, so context.questions.x.criteria must be { true: <meaning>, false: <meaning> }",
        ),
        (
            judge(),
            question(json!({"type": "rank", "instructions": "i", "criteria": {}})),
            "context.questions.x.type to be \"choice\", \"score\" or \"bool\", but got \"rank\"",
        ),
        (
            judge(),
            with("images", json!([png])),
            "the classifier \"p/judge\" accepts only text",
        ),
        (
            json!({"provider": "p", "id": "seer"}),
            with("images", json!("x")),
            "context.images to be an array of image blocks",
        ),
        (
            json!({"provider": "p", "id": "seer"}),
            with("images", json!([{"type": "text", "text": "x"}])),
            "context.images[0] to be an image block",
        ),
        (
            json!({"provider": "p", "id": "seer"}),
            with(
                "images",
                json!([{"type": "image", "data": "QUJD", "mimeType": "image/png"}]),
            ),
            "context.images[0] whose data is not a base64 PNG",
        ),
    ];
    for (model, context, expected) in cases {
        let args = json!({"model": model, "context": context});
        let err = f.classify.facts(&args).unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
        assert!(
            err.message.contains(expected),
            "expected {expected:?} in {:?}",
            err.message
        );
        if expected.contains("context") {
            assert!(
                err.message
                    .contains("Expected context: { state: { ... }, images?: ["),
                "{}",
                err.message
            );
        }
        let called = f.classify.call(script_call(args, "s")).await.unwrap_err();
        assert_eq!(called.message, err.message);
    }
    assert!(
        f.provider.requests().is_empty(),
        "no request for a refused call"
    );
}

#[tokio::test]
async fn models_turned_off_refuses_calls() {
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    let mut catalog =
        codemode_models::Catalog::from_json(&catalog_json(&provider.base_url())).unwrap();
    catalog.restrict(false, None);
    let tools = codemode_models::model_tools(std::sync::Arc::new(catalog), Default::default());
    let err = tools[0]
        .facts(&json!({"model": judge(), "context": one_choice_question()}))
        .unwrap_err();
    assert!(
        err.message.contains("models are turned off"),
        "{}",
        err.message
    );
}
