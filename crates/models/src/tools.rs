//! `models.classify` and `models.generateImages` as tools of kind [`CallKind::Model`], so every
//! model call passes the gate (policy, hooks, approval, budgets, audit) like any other call.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use codemode_spec::{
    CallFacts, CallKind, Effect, PreparedCall, Tool, ToolError, ToolErrorKind, ToolOutput,
    ToolSpec, Usage, prepared,
};
use serde_json::{Value, json};

use crate::catalog::{Catalog, Model};
use crate::http::{HttpClient, ModelsHttpConfig, Outgoing};
use crate::limiter::ScriptLimiter;
use crate::tokens::{self, InputCount};
use crate::validate::{self, ClassifyInput, ImagesInput, Operation};
use crate::{classify, images};

/// The model tools over one catalog. They share one limiter, so a script's classify and
/// generateImages calls together stay within four at a time.
pub fn model_tools(catalog: Arc<Catalog>, http: ModelsHttpConfig) -> Vec<Arc<dyn Tool>> {
    let shared = Arc::new(Shared {
        catalog,
        http: HttpClient::new(http),
        limiter: ScriptLimiter::default(),
    });
    vec![
        Arc::new(ModelTool::new(Operation::Classify, shared.clone())),
        Arc::new(ModelTool::new(Operation::GenerateImages, shared)),
    ]
}

struct Shared {
    catalog: Arc<Catalog>,
    http: HttpClient,
    limiter: ScriptLimiter,
}

struct ModelTool {
    op: Operation,
    spec: ToolSpec,
    shared: Arc<Shared>,
}

/// A checked call, ready to send.
enum Checked {
    Classify(Model, ClassifyInput),
    Images(Model, ImagesInput),
}

impl ModelTool {
    fn new(op: Operation, shared: Arc<Shared>) -> Self {
        let description = match op {
            Operation::Classify => {
                "Classify a state with a classifier model: models.classify(model, { state, images?, questions }). One request answers every question; choice answers carry label probabilities, score answers the expected level from 0 (lowest) to 1 (highest), bool answers the probability of true. Resolves to { provider, model, answers, usage?, stopReason, errorMessage? }; a provider failure resolves with stopReason \"error\"."
            }
            Operation::GenerateImages => {
                "Generate an image with an image model: models.generateImages(model, { input: [{ type: \"text\", text }] }). Resolves to { provider, model, output, usage?, stopReason, errorMessage? } where output holds { type: \"image\", data, mimeType } blocks; show them with image(block)."
            }
        };
        // Deliberately permissive: `facts` checks the model and context so that its messages
        // can show the expected shape, which a schema error could not.
        let schema = json!({
            "type": "object",
            "properties": { "model": {}, "context": {} },
            "required": ["model", "context"],
        });
        let mut spec = ToolSpec::new(op.tool_name(), description, schema);
        spec.kind = CallKind::Model;
        spec.namespace = Some("models".into());
        ModelTool { op, spec, shared }
    }

    fn check(&self, args: &Value) -> Result<Checked, ToolError> {
        let model_arg = args.get("model").unwrap_or(&Value::Null);
        let context = args.get("context").unwrap_or(&Value::Null);
        let model = validate::resolve_model(&self.shared.catalog, self.op, model_arg)?;
        Ok(match self.op {
            Operation::Classify => {
                Checked::Classify(model.clone(), validate::classify_input(model, context)?)
            }
            Operation::GenerateImages => {
                Checked::Images(model.clone(), validate::images_input(model, context)?)
            }
        })
    }
}

/// The most output tokens one generated image is billed at, as far as we know: gpt-image-1
/// bills 6,240 for its largest image at high quality. Reserved for an image model with token
/// prices, since its request has no `max_tokens` of its own.
const IMAGE_OUTPUT_TOKENS: u64 = 6_240;

impl Tool for ModelTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Refuses a bad model or context before any request, and names the model for the policy
    /// with a bound on what the request can cost, which the gate reserves.
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let checked = self.check(&args)?;
        let (model, body, max_output) = match &checked {
            Checked::Classify(m, input) => (
                m.clone(),
                classify::request_body(m, input),
                classify::max_output_tokens(input),
            ),
            Checked::Images(m, input) => (
                m.clone(),
                images::request_body(m, input),
                IMAGE_OUTPUT_TOKENS,
            ),
        };
        let sent = tokens::count_request(&body);
        let mut model_facts = model.facts();
        // An image model may bill tokens too (gpt-image-1 does): the gate reserves on both.
        model_facts.max_input_tokens = sent.bound;
        model_facts.max_output_tokens = max_output;
        let facts = CallFacts {
            model: Some(model_facts),
            ..CallFacts::default()
        };
        let shared = self.shared.clone();
        let request = Request {
            checked,
            body,
            sent,
            max_output,
        };
        Ok(prepared(facts, move |ctx| {
            Box::pin(async move {
                let script_id = ctx.provenance.script_id.clone();
                let went_out = AtomicBool::new(false);
                let work = async {
                    let _permit = shared.limiter.acquire(script_id.as_deref()).await;
                    run(&shared, request, &went_out).await
                };
                let (value, usage) = tokio::select! {
                    biased;
                    _ = ctx.cancel.cancelled() => {
                        // Like any tool's cancelled call: once the request went out the provider
                        // may bill it, so its effect is unknown and the gate charges the
                        // reservation.
                        return Err(if went_out.load(Ordering::SeqCst) {
                            ToolError {
                                kind: ToolErrorKind::Cancelled,
                                message: "the call was cancelled after its request was sent; the provider may still bill it".into(),
                                effect: Effect::Unknown,
                            }
                        } else {
                            ToolError::cancelled()
                        });
                    }
                    outcome = work => outcome,
                };
                Ok(ToolOutput {
                    value,
                    content: None,
                    is_error: false,
                    usage,
                    held: Default::default(),
                })
            })
        }))
    }
}

/// A checked call with its request body and codemode's own count of what it sends.
struct Request {
    checked: Checked,
    body: Value,
    sent: InputCount,
    max_output: u64,
}

/// Sends the request and turns every outcome into the script's result value.
async fn run(shared: &Shared, request: Request, went_out: &AtomicBool) -> (Value, Option<Usage>) {
    let Request {
        checked,
        body,
        sent,
        max_output,
    } = request;
    let (model, path) = match &checked {
        Checked::Classify(m, _) => (m, "chat/completions"),
        Checked::Images(m, _) => (m, "images/generations"),
    };
    let response = match send(shared, model, path, body, went_out).await {
        Ok(response) => response,
        Err(message) => {
            // Once the request went out the provider may bill it, whatever came back (an
            // error status, a body too large or not JSON): charge what it may have cost.
            let usage = went_out
                .load(Ordering::SeqCst)
                .then(|| unread_usage(&checked, sent, max_output));
            let mut value = failure(model, "error", &message);
            attach_usage(&mut value, usage.as_ref());
            return (value, usage);
        }
    };
    match &checked {
        Checked::Classify(m, input) => {
            let usage = Some(classify::usage_of(&response, m, sent, max_output));
            match classify::read_answers(input, &response) {
                Ok(answers) => {
                    let mut value = json!({
                        "provider": m.provider, "model": m.id, "answers": answers, "stopReason": "stop",
                    });
                    attach_usage(&mut value, usage.as_ref());
                    (value, usage)
                }
                Err(message) => {
                    let mut value = failure(m, "error", &message);
                    attach_usage(&mut value, usage.as_ref());
                    (value, usage)
                }
            }
        }
        Checked::Images(m, _) => match images::read_output(&response) {
            Ok(output) => {
                let count = output.iter().filter(|b| b["type"] == "image").count() as u64;
                let usage = images::usage_of(&response, count, m, sent, max_output);
                let mut value = json!({
                    "provider": m.provider, "model": m.id, "output": output, "stopReason": "stop",
                });
                attach_usage(&mut value, Some(&usage));
                (value, Some(usage))
            }
            Err(message) => {
                let usage = unread_usage(&checked, sent, max_output);
                let mut value = failure(m, "error", &message);
                attach_usage(&mut value, Some(&usage));
                (value, Some(usage))
            }
        },
    }
}

/// What a request whose answer could not be read is charged, marked estimated: codemode's own
/// count of the input and the whole `max_tokens` of output, or one image.
fn unread_usage(checked: &Checked, sent: InputCount, max_output: u64) -> Usage {
    match checked {
        Checked::Classify(m, _) => classify::usage_of(&Value::Null, m, sent, max_output),
        Checked::Images(m, _) => Usage {
            estimated: true,
            ..images::usage_of(&Value::Null, 1, m, sent, max_output)
        },
    }
}

async fn send(
    shared: &Shared,
    model: &Model,
    path: &str,
    body: Value,
    went_out: &AtomicBool,
) -> Result<Value, String> {
    let provider = shared
        .catalog
        .provider(&model.provider)
        .ok_or_else(|| format!("the provider \"{}\" is not in the catalog", model.provider))?;
    if provider.base_url.starts_with("https://") && !cfg!(feature = "tls") {
        return Err(format!(
            "the provider \"{}\" uses https, but this build of codemode has no TLS; rebuild with the `tls` feature of codemode-models, or serve the provider over http on loopback",
            model.provider
        ));
    }
    // An apiKeyCommand may block (a password manager), so it runs off the async threads.
    let api_key = {
        let catalog = shared.catalog.clone();
        let name = model.provider.clone();
        tokio::task::spawn_blocking(move || match catalog.provider(&name) {
            Some(p) => p.key.resolve(),
            None => Ok(None),
        })
        .await
        .map_err(|e| format!("looking up the API key failed: {e}"))?
        .map_err(|e| format!("the provider \"{}\" cannot be used: {e}", model.provider))?
    };
    went_out.store(true, Ordering::SeqCst);
    shared
        .http
        .post_json(Outgoing {
            provider: &provider.name,
            url: format!("{}/{path}", provider.base_url),
            api_key,
            headers: &provider.headers,
            body,
        })
        .await
}

fn attach_usage(value: &mut Value, usage: Option<&Usage>) {
    if let (Some(obj), Some(usage)) = (value.as_object_mut(), usage) {
        obj.insert(
            "usage".into(),
            serde_json::to_value(usage).unwrap_or(Value::Null),
        );
    }
}

/// The result of a call that did not produce answers: the promise still resolves.
fn failure(model: &Model, stop_reason: &str, message: &str) -> Value {
    let mut value = json!({
        "provider": model.provider,
        "model": model.id,
        "stopReason": stop_reason,
        "errorMessage": message,
    });
    let empty = match model.model_type.as_str() {
        "image" => ("output", json!([])),
        _ => ("answers", json!({})),
    };
    if let Some(obj) = value.as_object_mut() {
        obj.insert(empty.0.into(), empty.1);
    }
    value
}
