//! Shared fixtures: a catalog pointing at the loopback test provider.
#![allow(dead_code)]

use std::sync::Arc;

use codemode_models::testing::TestProvider;
use codemode_models::{Catalog, ModelsHttpConfig, model_tools};
use codemode_spec::{Provenance, Tool, ToolCall, ToolError, ToolOutput};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Cargo sets this for every test process, so it is a credential that is present without
/// touching the environment.
pub const KEY_ENV: &str = "CARGO_PKG_NAME";
pub const KEY: &str = "codemode-models";

pub fn catalog_json(base_url: &str) -> Value {
    json!({
        "providers": {
            "p": {
                "api": "openai-compatible",
                "baseUrl": base_url,
                "apiKeyEnv": KEY_ENV,
                "headers": { "X-Org": "acme" }
            }
        },
        "models": [
            { "provider": "p", "id": "judge", "name": "Judge", "type": "classifier",
              "input": ["text"], "price": { "input": 1.0, "output": 4.0 } },
            { "provider": "p", "id": "seer", "type": "classifier", "input": ["text", "image"] },
            { "provider": "p", "id": "painter", "type": "image", "price": { "image": 0.04 } },
            { "provider": "p", "id": "talker", "type": "chat" }
        ]
    })
}

pub struct Fixture {
    pub provider: TestProvider,
    pub classify: Arc<dyn Tool>,
    pub images: Arc<dyn Tool>,
}

pub async fn fixture() -> Fixture {
    fixture_with(ModelsHttpConfig::default()).await
}

pub async fn fixture_with(http: ModelsHttpConfig) -> Fixture {
    let provider = TestProvider::start().await.unwrap();
    let catalog = Catalog::from_json(&catalog_json(&provider.base_url())).unwrap();
    let tools = model_tools(Arc::new(catalog), http);
    let classify = tools
        .iter()
        .find(|t| t.spec().name == "models.classify")
        .unwrap()
        .clone();
    let images = tools
        .iter()
        .find(|t| t.spec().name == "models.generateImages")
        .unwrap()
        .clone();
    Fixture {
        provider,
        classify,
        images,
    }
}

pub fn script_call(args: Value, script_id: &str) -> ToolCall {
    let mut provenance = Provenance::model("c1", "s1");
    provenance.script_id = Some(script_id.into());
    ToolCall {
        args,
        provenance,
        cancel: CancellationToken::new(),
    }
}

/// Checks facts (as the gate does) and then calls.
pub async fn gated(tool: &Arc<dyn Tool>, args: Value) -> Result<ToolOutput, ToolError> {
    tool.facts(&args)?;
    tool.call(script_call(args, "script-1")).await
}

pub fn judge() -> Value {
    json!({ "type": "classifier", "provider": "p", "id": "judge" })
}

pub fn painter() -> Value {
    json!({ "type": "image", "provider": "p", "id": "painter" })
}

pub fn one_choice_question() -> Value {
    json!({
        "state": { "text": "I love it" },
        "questions": {
            "sentiment": { "type": "choice", "instructions": "How does the writer feel?",
                           "criteria": { "positive": "likes it", "negative": "dislikes it", "neutral": "neither" } }
        }
    })
}

/// Runs `call`, cancelling `cancel` once the provider has received a request: a call cut off
/// while its request is out.
pub async fn cancel_once_sent<T>(
    provider: &TestProvider,
    cancel: CancellationToken,
    call: impl std::future::Future<Output = T>,
) -> T {
    let waiter = async {
        while provider.requests().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(call, waiter);
    result
}
