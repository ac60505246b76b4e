//! Codemode's own token counts of a request, so a model call is never free and a parallel burst
//! cannot pass a cost cap: the provider's `usage` may be missing, zero, negative or too small.
//!
//! Byte-level BPE tokenizers (GPT, Llama, Claude) never make a token of less than one byte of
//! text, so the UTF-8 length of the request is an upper bound on its text tokens whatever the
//! script (CJK, emoji, random bytes). The estimate charged when the provider reports less is
//! the usual rule of thumb: four ASCII bytes per token, one token per other character.

use serde_json::Value;

/// Tokens one attached image is bounded by, reserved before the call: the dearest current
/// vision model's large image (OpenAI bills a high-detail 2048×2048 image on gpt-4o-mini as
/// 25,501 tokens; most models bill 1,100 to 2,500). A bound of 2,000 let a red team's one
/// `classify` of 60 images be admitted under a $0.05 cap and cost $0.23.
const IMAGE_TOKEN_BOUND: u64 = 25_600;

/// Tokens one image is charged at least, when the provider reports less.
const IMAGE_TOKEN_ESTIMATE: u64 = 1_000;

/// Codemode's counts of what a request sends.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct InputCount {
    /// What the request is charged at least, whatever the provider reports.
    pub estimate: u64,
    /// What the provider can bill at most; reserved before the call.
    pub bound: u64,
}

/// Counts a chat-completions or images request body. Image data (a `data:` URL) counts as a
/// fixed bound per image, not by its base64 length.
pub(crate) fn count_request(body: &Value) -> InputCount {
    let mut count = InputCount::default();
    walk(body, &mut count);
    count
}

fn walk(value: &Value, count: &mut InputCount) {
    match value {
        Value::String(s) if s.starts_with("data:") && s.contains(";base64,") => {
            count.estimate += IMAGE_TOKEN_ESTIMATE;
            count.bound += IMAGE_TOKEN_BOUND;
        }
        Value::String(s) => {
            let ascii = s.bytes().filter(u8::is_ascii).count() as u64;
            let other = s.chars().filter(|c| !c.is_ascii()).count() as u64;
            count.estimate += ascii.div_ceil(4) + other;
            // The quotes and separator around it cover the message framing tokens.
            count.bound += s.len() as u64 + 3;
        }
        Value::Array(items) => items.iter().for_each(|v| walk(v, count)),
        Value::Object(map) => {
            for (key, v) in map {
                count.bound += key.len() as u64 + 3;
                walk(v, count);
            }
        }
        other => count.bound += other.to_string().len() as u64,
    }
}

/// A token count from a provider's usage object: a non-negative, finite number, or `None`.
pub(crate) fn reported(usage: Option<&Value>, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| {
        let n = usage?.get(*k)?;
        n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f.min(u64::MAX as f64) as u64)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cjk_counts_one_token_per_character_and_bounds_by_bytes() {
        let ascii = count_request(&json!({ "content": "x".repeat(4000) }));
        assert_eq!(ascii.estimate, 1000);
        assert!(ascii.bound >= 4000);
        let cjk = count_request(&json!({ "content": "漢".repeat(4000) }));
        assert_eq!(cjk.estimate, 4000);
        assert!(cjk.bound >= 12_000, "three UTF-8 bytes per character");
    }

    #[test]
    fn an_image_counts_a_fixed_bound_not_its_base64() {
        let url = format!("data:image/png;base64,{}", "A".repeat(1_000_000));
        let c = count_request(&json!([{ "image_url": { "url": url } }]));
        assert!(c.bound < 3 * IMAGE_TOKEN_BOUND);
        assert!(c.estimate >= IMAGE_TOKEN_ESTIMATE);
        // Sixty images are reserved as the dearest model would bill them (a red team's one
        // call of 60 large images cost $0.23 under a $0.05 cap when each was bounded at 2,000).
        let many: Vec<_> = (0..60)
            .map(|_| json!({ "image_url": { "url": format!("data:image/png;base64,{}", "A".repeat(100)) } }))
            .collect();
        assert!(count_request(&json!(many)).bound >= 60 * 25_501);
    }

    #[test]
    fn negative_and_missing_numbers_are_not_reports() {
        let u = json!({ "prompt_tokens": -5, "completion_tokens": 1e15 });
        assert_eq!(reported(Some(&u), &["prompt_tokens"]), None);
        assert_eq!(
            reported(Some(&u), &["completion_tokens"]),
            Some(1_000_000_000_000_000)
        );
        assert_eq!(reported(None, &["prompt_tokens"]), None);
    }
}
