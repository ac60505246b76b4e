//! A provider that answers with a redirect: codemode sends a provider's key, headers and the
//! script's data only to the URL the user configured, never to wherever the answer points.

mod common;

use std::sync::Arc;

use codemode_models::testing::TestProvider;
use codemode_models::{Catalog, ModelsHttpConfig, model_tools};
use common::*;
use serde_json::{Value, json};

/// A credential in a header, as Azure (`api-key`) and Anthropic-style (`x-api-key`) gateways
/// take it.
const HEADER_KEY: &str = "header-secret-7f3a9c";

fn classify_args() -> Value {
    json!({"model": judge(), "context": {
        "state": { "text": "private customer notes" },
        "questions": { "s": { "type": "choice", "instructions": "x", "criteria": { "a": "a", "b": "b" } } }
    }})
}

/// Red team: reqwest follows up to ten redirects by default and, going to another host, drops
/// only `Authorization` and cookies: a provider (or whoever answers at its address) that
/// redirected with 307 received the catalog's `api-key` header and the whole request body at
/// the host it named.
#[tokio::test]
async fn a_redirect_to_another_host_sends_it_neither_headers_nor_data() {
    let provider = TestProvider::start().await.unwrap();
    let elsewhere = TestProvider::start().await.unwrap();
    let mut models = catalog_json(&provider.base_url());
    models["providers"]["p"]["headers"] = json!({ "api-key": HEADER_KEY });
    let catalog = Catalog::from_json(&models).unwrap();
    let tools = model_tools(Arc::new(catalog), ModelsHttpConfig::default());
    let classify = tools
        .iter()
        .find(|t| t.spec().name == "models.classify")
        .unwrap();
    for status in [301, 302, 303, 307, 308] {
        provider.configure(|k| {
            k.redirect = Some((status, format!("{}/chat/completions", elsewhere.base_url())))
        });
        let out = gated(classify, classify_args()).await.unwrap();
        for seen in elsewhere.requests() {
            let headers = format!("{:?}", seen.headers);
            assert!(
                !headers.contains(HEADER_KEY) && !headers.contains(KEY),
                "{status}: a credential reached the other host: {headers}"
            );
            assert!(
                !seen.body.to_string().contains("private customer notes"),
                "{status}: the script's data reached the other host"
            );
        }
        assert!(
            elsewhere.requests().is_empty(),
            "{status}: the redirect was followed: {:?}",
            elsewhere.requests()
        );
        assert_eq!(out.value["stopReason"], "error", "{status}: {}", out.value);
        let message = out.value["errorMessage"].as_str().unwrap_or_default();
        assert!(message.contains("redirect"), "{status}: {message}");
        assert!(
            !message.contains(&elsewhere.base_url()),
            "{status}: scripts never see provider URLs: {message}"
        );
        // The request went out: it is charged as one the provider may bill.
        assert!(out.usage.is_some_and(|u| u.estimated), "{status}");
    }
}
