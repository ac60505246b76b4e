//! One classify call as one chat-completions request.
//!
//! Every answer is a single-character code (A-Z for choice labels, 0-9 for score levels, Y/N for
//! bool) constrained by a JSON schema. A code is one token in every common tokenizer, so the
//! token's `top_logprobs` give the model's probability for each label directly, without
//! sampling several times.

use std::collections::HashMap;

use codemode_spec::Usage;
use serde_json::{Map, Value, json};

use crate::catalog::Model;
use crate::tokens::{InputCount, reported};
use crate::validate::{ClassifyInput, Question, QuestionKind};

/// Alternatives asked for at each token position (the OpenAI maximum).
const TOP_LOGPROBS: u64 = 20;

/// The codes a question is answered with, in the order of its labels or levels.
pub(crate) fn codes(kind: &QuestionKind) -> Vec<char> {
    match kind {
        QuestionKind::Choice(labels) => ('A'..='Z').take(labels.len()).collect(),
        QuestionKind::Score(levels) => ('0'..='9').take(levels.len()).collect(),
        QuestionKind::Bool { .. } => vec!['Y', 'N'],
    }
}

/// The key a question is answered under; positional, so script ids need no escaping.
fn answer_key(index: usize) -> String {
    format!("q{}", index + 1)
}

/// The chat-completions request body.
pub(crate) fn request_body(model: &Model, input: &ClassifyInput) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut listing = String::new();
    for (i, q) in input.questions.iter().enumerate() {
        let key = answer_key(i);
        let codes = codes(&q.kind);
        properties.insert(
            key.clone(),
            json!({ "type": "string", "enum": codes.iter().map(char::to_string).collect::<Vec<_>>() }),
        );
        required.push(Value::String(key.clone()));
        listing.push_str(&describe_question(&key, q, &codes));
    }
    let state = serde_json::to_string_pretty(&input.state).unwrap_or_else(|_| "{}".into());
    let text = format!(
        "State:\n```json\n{state}\n```\n\nQuestions:\n{listing}\nReply with a JSON object with the keys {}, each set to exactly one of the codes listed for that question.",
        (0..input.questions.len())
            .map(answer_key)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let user_content = if input.images.is_empty() {
        Value::String(text)
    } else {
        let mut parts = vec![json!({ "type": "text", "text": text })];
        for image in &input.images {
            parts.push(json!({
                "type": "image_url",
                "image_url": { "url": format!("data:{};base64,{}", image.mime_type, image.data) },
            }));
        }
        Value::Array(parts)
    };
    json!({
        "model": model.id,
        "messages": [
            { "role": "system", "content": "You are a careful classifier. Read the state and any images, then answer every question with one of its codes. Reply with the JSON object only." },
            { "role": "user", "content": user_content },
        ],
        "temperature": 0,
        "max_tokens": max_output_tokens(input),
        "logprobs": true,
        "top_logprobs": TOP_LOGPROBS,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "answers",
                "strict": true,
                "schema": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                },
            },
        },
    })
}

fn describe_question(key: &str, q: &Question, codes: &[char]) -> String {
    let mut out = format!("\n{key}: {}\n", q.instructions);
    match &q.kind {
        QuestionKind::Choice(labels) => {
            out.push_str("Choose the label that fits:\n");
            for (code, (label, meaning)) in codes.iter().zip(labels) {
                out.push_str(&format!("  {code} = {label}: {meaning}\n"));
            }
        }
        QuestionKind::Score(levels) => {
            out.push_str("Choose the level that fits (lowest first):\n");
            for (code, level) in codes.iter().zip(levels) {
                out.push_str(&format!("  {code} = {level}\n"));
            }
        }
        QuestionKind::Bool { yes, no } => {
            out.push_str(&format!("  Y = true: {yes}\n  N = false: {no}\n"));
        }
    }
    out
}

/// Reads the answers out of a chat-completions response.
pub(crate) fn read_answers(input: &ClassifyInput, response: &Value) -> Result<Value, String> {
    let choice = response
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or("the classifier's answer has no choices")?;
    let content = choice.pointer("/message/content").and_then(Value::as_str);
    // With log-probabilities, read the text the tokens spell so offsets line up with them. Some
    // servers report tokens that do not spell the content (byte-level pieces); then the content
    // is read alone and each answer counts as certain.
    let from_tokens = logprob_tokens(choice).and_then(|tokens| {
        let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
        scan_flat_object(&text).ok().map(|found| (tokens, found))
    });
    let (tokens, found) = match from_tokens {
        Some((tokens, found)) => (Some(tokens), found),
        None => {
            let text = content.ok_or("the classifier's answer has no message content")?;
            let found = scan_flat_object(text).map_err(|e| {
                format!(
                    "the classifier's answer is not the requested JSON object ({e}): {}",
                    clip(text)
                )
            })?;
            (None, found)
        }
    };
    let mut answers = Map::new();
    for (i, q) in input.questions.iter().enumerate() {
        let key = answer_key(i);
        let codes = codes(&q.kind);
        let (offset, value) = found
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, o, v)| (*o, v.clone()))
            .ok_or_else(|| {
                format!(
                    "the classifier did not answer {key} (question \"{}\")",
                    q.id
                )
            })?;
        let chosen = value
            .chars()
            .next()
            .filter(|c| value.chars().count() == 1 && codes.contains(c))
            .ok_or_else(|| {
                format!(
                    "the classifier answered {key} (question \"{}\") with {value:?}, which is not one of its codes",
                    q.id
                )
            })?;
        let probs = tokens
            .as_ref()
            .and_then(|t| code_probabilities(t, offset, &codes))
            .unwrap_or_else(|| one_hot(&codes, chosen));
        answers.insert(q.id.clone(), answer(&q.kind, &probs));
    }
    Ok(Value::Object(answers))
}

/// Tokens charged for a classify call. Fails closed: the input is codemode's own estimate of
/// what it sent when the provider reports none or less than half of it, and the output is the reported count or, when it is missing or
/// zero, the request's `max_tokens`. `estimated` says when either replaced the provider's.
pub(crate) fn usage_of(
    response: &Value,
    model: &Model,
    sent: InputCount,
    max_output: u64,
) -> Usage {
    let usage = response.get("usage");
    let reported_input = reported(usage, &["prompt_tokens", "input_tokens"]);
    let reported_output =
        reported(usage, &["completion_tokens", "output_tokens"]).filter(|n| *n > 0);
    // Real tokenizers land within a factor of two of the estimate; a report below half of it
    // (zero, say) is not believed.
    let plausible_input = reported_input.filter(|n| *n >= sent.estimate / 2);
    let input = plausible_input.unwrap_or(sent.estimate);
    let output = reported_output.unwrap_or(max_output);
    let estimated = plausible_input.is_none() || reported_output.is_none();
    Usage {
        input_tokens: input,
        output_tokens: output,
        images: 0,
        cost_usd: token_cost(model, input, output),
        estimated,
    }
}

/// The `max_tokens` a classify request allows.
pub(crate) fn max_output_tokens(input: &ClassifyInput) -> u64 {
    16 + 12 * input.questions.len() as u64
}

pub(crate) fn token_cost(model: &Model, input: u64, output: u64) -> f64 {
    (input as f64 * model.price.input + output as f64 * model.price.output) / 1_000_000.0
}

fn one_hot(codes: &[char], chosen: char) -> Vec<f64> {
    codes
        .iter()
        .map(|c| if *c == chosen { 1.0 } else { 0.0 })
        .collect()
}

/// The answer object for one question from the probabilities of its codes.
fn answer(kind: &QuestionKind, probs: &[f64]) -> Value {
    let best = probs.iter().enumerate().fold(
        (0, f64::MIN),
        |acc, (i, p)| if *p > acc.1 { (i, *p) } else { acc },
    );
    match kind {
        QuestionKind::Choice(labels) => {
            let probabilities: Map<String, Value> = labels
                .iter()
                .zip(probs)
                .map(|((label, _), p)| (label.clone(), json!(p)))
                .collect();
            json!({
                "type": "choice",
                "choice": labels.get(best.0).map(|(l, _)| l.clone()),
                "probabilities": probabilities,
                "confidence": best.1,
            })
        }
        QuestionKind::Score(levels) => {
            // The expected level, scaled so the lowest level is 0 and the highest 1.
            let top = (levels.len().max(2) - 1) as f64;
            let expected: f64 = probs.iter().enumerate().map(|(i, p)| i as f64 * p).sum();
            json!({
                "type": "score",
                "score": expected / top,
                "confidence": best.1,
                "level": levels.get(best.0),
            })
        }
        QuestionKind::Bool { .. } => json!({
            "type": "bool",
            "probability": probs.first().copied().unwrap_or(0.0),
        }),
    }
}

#[derive(Debug)]
struct Token {
    text: String,
    logprob: f64,
    top: Vec<(String, f64)>,
}

fn logprob_tokens(choice: &Value) -> Option<Vec<Token>> {
    let content = choice.pointer("/logprobs/content")?.as_array()?;
    if content.is_empty() {
        return None;
    }
    content
        .iter()
        .map(|t| {
            let top = t
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|alts| {
                    alts.iter()
                        .filter_map(|a| {
                            Some((
                                a.get("token")?.as_str()?.to_string(),
                                a.get("logprob")?.as_f64()?,
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(Token {
                text: t.get("token")?.as_str()?.to_string(),
                logprob: t.get("logprob").and_then(Value::as_f64).unwrap_or(0.0),
                top,
            })
        })
        .collect()
}

/// Probabilities of each code at byte `offset` of the generated text, normalised over the
/// codes. An alternative token counts for a code when it agrees with the chosen token up to the
/// answer's position and has the code there, which handles tokens such as `"A` or `A",`.
fn code_probabilities(tokens: &[Token], offset: usize, codes: &[char]) -> Option<Vec<f64>> {
    let mut start = 0;
    let token = tokens.iter().find(|t| {
        let hit = offset >= start && offset < start + t.text.len();
        start += t.text.len();
        hit
    })?;
    let token_start = start - token.text.len();
    let k = offset - token_start;
    let prefix = token.text.get(..k)?;
    let mut alternatives: HashMap<&str, f64> = HashMap::new();
    for (text, lp) in &token.top {
        alternatives.entry(text.as_str()).or_insert(*lp);
    }
    alternatives
        .entry(token.text.as_str())
        .or_insert(token.logprob);
    let mut probs = vec![0.0; codes.len()];
    for (text, lp) in alternatives {
        if !text.starts_with(prefix) {
            continue;
        }
        let Some(c) = text.get(k..).and_then(|rest| rest.chars().next()) else {
            continue;
        };
        if let Some(i) = codes.iter().position(|code| *code == c) {
            probs[i] += lp.exp();
        }
    }
    let total: f64 = probs.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    Some(probs.into_iter().map(|p| p / total).collect())
}

/// Reads `{"key": "value", ...}` with string values, returning each key, the byte offset of the
/// value's first character and the value. Only what the schema allows needs to be read.
fn scan_flat_object(text: &str) -> Result<Vec<(String, usize, String)>, String> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    let skip_ws = |pos: &mut usize| {
        while *pos < bytes.len() && bytes[*pos].is_ascii_whitespace() {
            *pos += 1;
        }
    };
    let expect = |pos: &mut usize, b: u8| -> Result<(), String> {
        if bytes.get(*pos) == Some(&b) {
            *pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", b as char, *pos))
        }
    };
    let string = |pos: &mut usize| -> Result<(usize, String), String> {
        if bytes.get(*pos) != Some(&b'"') {
            return Err(format!("expected a string at byte {}", *pos));
        }
        let start = *pos + 1;
        let mut i = start;
        while i < bytes.len() && bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        if i >= bytes.len() {
            return Err("a string is not closed".into());
        }
        *pos = i + 1;
        let raw = text.get(start..i).ok_or("a string is not valid text")?;
        Ok((start, raw.to_string()))
    };
    skip_ws(&mut pos);
    expect(&mut pos, b'{')?;
    let mut out = Vec::new();
    loop {
        skip_ws(&mut pos);
        if bytes.get(pos) == Some(&b'}') {
            break;
        }
        let (_, key) = string(&mut pos)?;
        skip_ws(&mut pos);
        expect(&mut pos, b':')?;
        skip_ws(&mut pos);
        let (offset, value) = string(&mut pos)?;
        out.push((key, offset, value));
        skip_ws(&mut pos);
        match bytes.get(pos) {
            Some(b',') => pos += 1,
            Some(b'}') => break,
            _ => return Err(format!("expected ',' or '}}' at byte {pos}")),
        }
    }
    Ok(out)
}

fn clip(text: &str) -> String {
    let clipped: String = text.chars().take(200).collect();
    if clipped.len() < text.len() {
        format!("{clipped}…")
    } else {
        clipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(text: &str, lp: f64, top: &[(&str, f64)]) -> Token {
        Token {
            text: text.into(),
            logprob: lp,
            top: top.iter().map(|(t, l)| (t.to_string(), *l)).collect(),
        }
    }

    #[test]
    fn scans_offsets_of_values() {
        let found = scan_flat_object(r#" {"q1":"A", "q2" : "7"}"#).unwrap();
        assert_eq!(found[0], ("q1".into(), 8, "A".into()));
        assert_eq!(found[1], ("q2".into(), 20, "7".into()));
        assert!(scan_flat_object(r#"{"q1":"A""#).is_err());
        assert!(scan_flat_object("no json").is_err());
    }

    #[test]
    fn merged_tokens_are_matched_by_prefix() {
        // Text: {"q1":"B"} where the answer token is `"B` (quote merged with the code).
        let tokens = vec![
            tok("{\"q1\":", 0.0, &[]),
            tok(
                "\"B",
                0.6f64.ln(),
                &[
                    ("\"B", 0.6f64.ln()),
                    ("\"A", 0.3f64.ln()),
                    ("\"Z", 0.05f64.ln()),
                    ("x", 0.05f64.ln()),
                ],
            ),
            tok("\"}", 0.0, &[]),
        ];
        let probs = code_probabilities(&tokens, 7, &['A', 'B']).unwrap();
        assert!((probs[0] - 0.3 / 0.9).abs() < 1e-9);
        assert!((probs[1] - 0.6 / 0.9).abs() < 1e-9);
    }
}
