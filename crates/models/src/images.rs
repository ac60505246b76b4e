//! Image generation through the OpenAI-compatible `images/generations` endpoint.

use codemode_spec::Usage;
use serde_json::{Value, json};

use crate::catalog::Model;
use crate::classify::token_cost;
use crate::mime::image_mime;
use crate::tokens::{InputCount, reported};
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

/// What an image call is charged: its images at the price per image, and for a model billed
/// by tokens too, its tokens. Fails closed like a classify call: when the provider reports no
/// input tokens or less than half of codemode's count, the count stands in; when it reports no
/// output tokens (or zero), each image is charged `max_output` of them. `estimated` says so.
pub(crate) fn usage_of(
    response: &Value,
    images: u64,
    model: &Model,
    sent: InputCount,
    max_output: u64,
) -> Usage {
    let usage = response.get("usage");
    let reported_input = reported(usage, &["input_tokens", "prompt_tokens"]);
    let reported_output =
        reported(usage, &["output_tokens", "completion_tokens"]).filter(|n| *n > 0);
    let (input, output, estimated) = if model.price.input > 0.0 || model.price.output > 0.0 {
        let plausible_input = reported_input.filter(|n| *n >= sent.estimate / 2);
        (
            plausible_input.unwrap_or(sent.estimate),
            reported_output.unwrap_or(max_output.saturating_mul(images.max(1))),
            plausible_input.is_none() || reported_output.is_none(),
        )
    } else {
        // Billed per image only: its token counts are information, not cost.
        (
            reported_input.unwrap_or(0),
            reported_output.unwrap_or(0),
            false,
        )
    };
    Usage {
        input_tokens: input,
        output_tokens: output,
        images,
        cost_usd: images as f64 * model.price.image + token_cost(model, input, output),
        estimated,
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
