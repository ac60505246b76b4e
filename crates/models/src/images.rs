//! Image generation through the OpenAI-compatible `images/generations` endpoint.

use codemode_spec::Usage;
use serde_json::{Value, json};

use crate::catalog::Model;
use crate::classify::token_cost;
use crate::mime::image_mime;
use crate::tokens::reported;
use crate::validate::ImagesInput;

pub(crate) fn request_body(model: &Model, input: &ImagesInput) -> Value {
    json!({
        "model": model.id,
        "prompt": input.prompt,
        "n": 1,
        "response_format": "b64_json",
    })
}

/// The output blocks: each generated image as `{type:"image", data, mimeType}` with the type
/// judged from its bytes, preceded by the provider's revised prompt when it gives one.
pub(crate) fn read_output(response: &Value) -> Result<Vec<Value>, String> {
    let data = response
        .get("data")
        .and_then(Value::as_array)
        .ok_or("the image provider's answer has no data array")?;
    let mut output = Vec::new();
    for (i, item) in data.iter().enumerate() {
        if let Some(revised) = item.get("revised_prompt").and_then(Value::as_str) {
            output.push(json!({ "type": "text", "text": revised }));
        }
        let b64 = item.get("b64_json").and_then(Value::as_str).ok_or_else(|| {
            format!("the image provider's data[{i}] has no b64_json image (was response_format ignored?)")
        })?;
        let mime = image_mime(b64).ok_or_else(|| {
            format!("the image provider's data[{i}] is not a base64 PNG, JPEG, GIF or WebP image")
        })?;
        output.push(json!({ "type": "image", "data": b64, "mimeType": mime }));
    }
    if !output.iter().any(|b| b["type"] == "image") {
        return Err("the image provider returned no image".into());
    }
    Ok(output)
}

pub(crate) fn usage_of(response: &Value, output: &[Value], model: &Model) -> Usage {
    let images = output.iter().filter(|b| b["type"] == "image").count() as u64;
    let usage = response.get("usage");
    let input = reported(usage, &["input_tokens", "prompt_tokens"]).unwrap_or(0);
    let output_tokens = reported(usage, &["output_tokens", "completion_tokens"]).unwrap_or(0);
    Usage {
        input_tokens: input,
        output_tokens,
        images,
        cost_usd: images as f64 * model.price.image + token_cost(model, input, output_tokens),
        estimated: false,
    }
}

/// How many image blocks a `generateImages` result holds, for the runtime's note about images
/// a script did not show.
pub fn image_count(result: &Value) -> usize {
    result
        .get("output")
        .and_then(Value::as_array)
        .map_or(0, |blocks| {
            blocks.iter().filter(|b| b["type"] == "image").count()
        })
}
