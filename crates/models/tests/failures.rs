//! Provider failures resolve with stopReason "error" and a clear message; they never fail the
//! tool call, so the script's promise resolves.

mod common;

use std::time::{Duration, Instant};

use codemode_models::ModelsHttpConfig;
use common::*;
use serde_json::{Value, json};

fn classify_args() -> Value {
    json!({"model": judge(), "context": one_choice_question()})
}

fn image_args() -> Value {
    json!({"model": painter(), "context": {"input": [{"type": "text", "text": "fox"}]}})
}

fn assert_error(value: &Value, needle: &str) {
    assert_eq!(value["stopReason"], "error", "{value}");
    let message = value["errorMessage"].as_str().unwrap();
    assert!(
        message.contains(needle),
        "expected {needle:?} in {message:?}"
    );
    assert!(
        !message.contains("127.0.0.1"),
        "provider URLs stay hidden: {message}"
    );
    assert_eq!(value["provider"], "p");
}

#[tokio::test]
async fn http_500_is_an_error_result() {
    let f = fixture().await;
    f.provider.configure(|k| k.status = Some(500));
    let out = gated(&f.classify, classify_args()).await.unwrap();
    assert_error(&out.value, "answered HTTP 500");
    assert_eq!(out.value["answers"], json!({}));
    // The request went out: the provider may bill it, so it is charged what it may have cost
    // (red-team round 4: failed calls used to cost nothing).
    assert_charged_estimate(&out);
    let out = gated(&f.images, image_args()).await.unwrap();
    assert_error(&out.value, "answered HTTP 500");
    assert_eq!(out.value["output"], json!([]));
    let usage = out
        .usage
        .expect("an image request that went out is charged");
    assert!(usage.estimated && usage.images == 1, "{usage:?}");
}

fn assert_charged_estimate(out: &codemode_spec::ToolOutput) {
    let usage = out
        .usage
        .as_ref()
        .expect("a request that went out is charged");
    assert!(usage.estimated, "{usage:?}");
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );
    assert_eq!(out.value["usage"]["estimated"], true, "{}", out.value);
}

#[tokio::test]
async fn malformed_json_is_an_error_result() {
    let f = fixture().await;
    f.provider.configure(|k| k.malformed_json = true);
    let out = gated(&f.classify, classify_args()).await.unwrap();
    assert_error(&out.value, "malformed JSON");
    assert_charged_estimate(&out);
    let out = gated(&f.images, image_args()).await.unwrap();
    assert_error(&out.value, "malformed JSON");
    assert!(out.usage.is_some_and(|u| u.estimated), "charged");
}

#[tokio::test]
async fn an_unreadable_answer_is_an_error_result_that_still_reports_usage() {
    let f = fixture().await;
    for (content, needle) in [
        ("I think it is positive.", "not the requested JSON object"),
        (
            "{\"q2\": \"A\"}",
            "did not answer q1 (question \"sentiment\")",
        ),
        (
            "{\"q1\": \"Q\"}",
            "answered q1 (question \"sentiment\") with \"Q\", which is not one of its codes",
        ),
    ] {
        f.provider
            .configure(|k| k.content = Some(content.to_string()));
        let out = gated(&f.classify, classify_args()).await.unwrap();
        assert_error(&out.value, needle);
        assert_eq!(
            out.usage.unwrap().input_tokens,
            100,
            "the tokens were spent all the same"
        );
        assert_eq!(out.value["usage"]["inputTokens"], 100);
    }
}

#[tokio::test]
async fn a_slow_provider_times_out() {
    let f = fixture_with(ModelsHttpConfig {
        request_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    f.provider.configure(|k| k.delay = Duration::from_secs(30));
    let started = Instant::now();
    let out = gated(&f.classify, classify_args()).await.unwrap();
    assert_error(&out.value, "did not answer within 0.3 s");
    // Generous: the point is that it does not wait the provider's 30 s.
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[tokio::test]
async fn a_20_mb_image_is_refused_at_the_cap() {
    let f = fixture().await;
    f.provider
        .configure(|k| k.image_bytes = Some(20 * 1024 * 1024));
    let out = gated(&f.images, image_args()).await.unwrap();
    assert_error(&out.value, "more than the limit of 16777216 bytes");
}

#[tokio::test]
async fn a_20_mb_image_without_content_length_is_cut_off_while_reading() {
    let f = fixture().await;
    f.provider.configure(|k| {
        k.image_bytes = Some(20 * 1024 * 1024);
        k.chunked = true;
    });
    let out = gated(&f.images, image_args()).await.unwrap();
    assert_error(
        &out.value,
        "larger than the limit of 16777216 bytes; it was not read further",
    );
}

#[tokio::test]
async fn chunked_answers_within_the_cap_are_read_whole() {
    let f = fixture().await;
    f.provider.configure(|k| {
        k.chunked = true;
        k.label_probs = vec![vec![0.25, 0.25, 0.5]];
    });
    let out = gated(&f.classify, classify_args()).await.unwrap();
    assert_eq!(
        out.value["answers"]["sentiment"]["choice"], "neutral",
        "{}",
        out.value
    );
}

#[tokio::test]
async fn a_large_image_within_a_raised_cap_is_returned() {
    let f = fixture_with(ModelsHttpConfig {
        max_response_bytes: 4 * 1024 * 1024,
        ..Default::default()
    })
    .await;
    f.provider
        .configure(|k| k.image_bytes = Some(2 * 1024 * 1024));
    let out = gated(&f.images, image_args()).await.unwrap();
    assert_eq!(out.value["stopReason"], "stop");
    assert_eq!(out.value["output"][0]["mimeType"], "image/png");
    assert_eq!(
        out.value["output"][0]["data"].as_str().unwrap().len(),
        (2 * 1024 * 1024usize).div_ceil(3) * 4
    );
}

#[tokio::test]
async fn an_unreachable_provider_is_an_error_result() {
    // Bind then drop a listener to get a loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let catalog =
        codemode_models::Catalog::from_json(&catalog_json(&format!("http://127.0.0.1:{port}/v1")))
            .unwrap();
    let tools = codemode_models::model_tools(std::sync::Arc::new(catalog), Default::default());
    let out = gated(&tools[0], classify_args()).await.unwrap();
    assert_error(&out.value, "could not be reached");
}

#[tokio::test]
async fn a_missing_key_is_an_error_result_without_a_request() {
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    let mut doc = catalog_json(&provider.base_url());
    doc["providers"]["p"]["apiKeyEnv"] = json!("CODEMODE_TEST_SURELY_UNSET_7Q3");
    let catalog = codemode_models::Catalog::from_json(&doc).unwrap();
    let tools = codemode_models::model_tools(std::sync::Arc::new(catalog), Default::default());
    let out = gated(&tools[0], classify_args()).await.unwrap();
    assert_error(
        &out.value,
        "set the environment variable CODEMODE_TEST_SURELY_UNSET_7Q3",
    );
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn a_cancelled_call_is_a_cancelled_error_not_a_result() {
    let f = fixture().await;
    f.provider.configure(|k| k.delay = Duration::from_secs(30));
    let call = script_call(classify_args(), "s");
    let cancel = call.cancel.clone();
    let pending = f.classify.call(call);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let e = pending.await.unwrap_err();
    assert_eq!(e.kind, codemode_spec::ToolErrorKind::Cancelled);
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn an_https_provider_without_tls_says_how_to_fix_it() {
    let catalog =
        codemode_models::Catalog::from_json(&catalog_json("https://127.0.0.1:9/v1")).unwrap();
    let tools = codemode_models::model_tools(std::sync::Arc::new(catalog), Default::default());
    let out = gated(&tools[0], classify_args()).await.unwrap();
    assert_error(&out.value, "rebuild with the `tls` feature");
}
