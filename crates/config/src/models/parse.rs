//! Reading one models.json value into loosely typed entries, with errors that name file and key.
//!
//! Every field is optional here so that a project file can name only what it changes; the merge
//! decides which fields each file may set.

use serde_json::{Map, Value};

use crate::Problem;

pub const API_OPENAI_COMPATIBLE: &str = "openai-compatible";
pub const MODEL_TYPES: [&str; 3] = ["classifier", "image", "chat"];
pub const INPUT_KINDS: [&str; 2] = ["text", "image"];

#[derive(Debug, Default, Clone)]
pub(crate) struct RawProvider {
    pub name: String,
    pub enabled: Option<bool>,
    pub api: Option<String>,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub api_key_command: Option<String>,
    pub headers: Option<Vec<(String, String)>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct RawPrice {
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub image: Option<f64>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct RawModel {
    /// Where the entry is, for messages: `models[2]`.
    pub key: String,
    pub provider: String,
    pub id: String,
    pub enabled: Option<bool>,
    pub name: Option<String>,
    pub model_type: Option<String>,
    pub input: Option<Vec<String>>,
    pub price: Option<RawPrice>,
}

#[derive(Debug, Default)]
pub(crate) struct RawFile {
    pub providers: Vec<RawProvider>,
    pub models: Vec<RawModel>,
}

/// Reads the whole document. `file` names the source in messages.
pub(crate) fn parse_file(value: &Value, file: &str) -> Result<RawFile, Problem> {
    let bad = |key: &str, message: String| Problem::new(file, key, message);
    let root = value.as_object().ok_or_else(|| {
        bad(
            "(top level)",
            "expected an object like { \"providers\": { ... }, \"models\": [ ... ] }".into(),
        )
    })?;
    for key in root.keys() {
        if key != "providers" && key != "models" {
            return Err(bad(
                key,
                "unknown key; a models file has only \"providers\" and \"models\"".into(),
            ));
        }
    }
    let mut raw = RawFile::default();
    if let Some(providers) = root.get("providers") {
        let providers = providers.as_object().ok_or_else(|| {
            bad(
                "providers",
                "expected an object mapping each provider name to its settings".into(),
            )
        })?;
        for (name, entry) in providers {
            raw.providers.push(parse_provider(
                name,
                entry,
                &format!("providers.{name}"),
                &bad,
            )?);
        }
    }
    if let Some(models) = root.get("models") {
        let models = models
            .as_array()
            .ok_or_else(|| bad("models", "expected an array of model entries".into()))?;
        for (i, entry) in models.iter().enumerate() {
            raw.models
                .push(parse_model(entry, &format!("models[{i}]"), &bad)?);
        }
    }
    Ok(raw)
}

type Bad<'a> = dyn Fn(&str, String) -> Problem + 'a;

fn parse_provider(
    name: &str,
    entry: &Value,
    key: &str,
    bad: &Bad<'_>,
) -> Result<RawProvider, Problem> {
    if name.is_empty() || name.contains('/') {
        return Err(bad(
            key,
            "a provider name must be non-empty and contain no '/'".into(),
        ));
    }
    let obj = entry.as_object().ok_or_else(|| {
        bad(
            key,
            "expected an object like { \"api\": \"openai-compatible\", \"baseUrl\": \"http://...\", \"apiKeyEnv\": \"VAR\" }".into(),
        )
    })?;
    let mut p = RawProvider {
        name: name.to_string(),
        ..Default::default()
    };
    for (field, value) in obj {
        let at = format!("{key}.{field}");
        match field.as_str() {
            "enabled" => p.enabled = Some(bool_of(value, &at, bad)?),
            "api" => {
                let api = string_of(value, &at, bad)?;
                if api != API_OPENAI_COMPATIBLE {
                    return Err(bad(
                        &at,
                        format!(
                            "unsupported api {api:?}; the only api is \"{API_OPENAI_COMPATIBLE}\""
                        ),
                    ));
                }
                p.api = Some(api);
            }
            "baseUrl" => {
                let url = string_of(value, &at, bad)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(
                        &at,
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
                p.base_url = Some(url.trim_end_matches('/').to_string());
            }
            "apiKeyEnv" => p.api_key_env = Some(non_empty(value, &at, bad)?),
            "apiKeyCommand" => p.api_key_command = Some(non_empty(value, &at, bad)?),
            "apiKey" => {
                return Err(bad(
                    &at,
                    "keys are not written into models files; put the key in an environment variable and name it with \"apiKeyEnv\", or give a command that prints it with \"apiKeyCommand\"".into(),
                ));
            }
            "headers" => {
                let map = value.as_object().ok_or_else(|| {
                    bad(
                        &at,
                        "expected an object of header names to string values".into(),
                    )
                })?;
                let mut headers = Vec::new();
                for (h, v) in map {
                    let v = v.as_str().ok_or_else(|| {
                        bad(
                            &format!("{at}.{h}"),
                            "a header value must be a string".into(),
                        )
                    })?;
                    headers.push((h.clone(), v.to_string()));
                }
                p.headers = Some(headers);
            }
            _ => {
                return Err(bad(
                    &at,
                    "unknown key; a provider has enabled, api, baseUrl, apiKeyEnv, apiKeyCommand and headers".into(),
                ));
            }
        }
    }
    if p.api_key_env.is_some() && p.api_key_command.is_some() {
        return Err(bad(
            key,
            "give either apiKeyEnv or apiKeyCommand, not both".into(),
        ));
    }
    Ok(p)
}

fn parse_model(entry: &Value, key: &str, bad: &Bad<'_>) -> Result<RawModel, Problem> {
    let obj = entry.as_object().ok_or_else(|| {
        bad(
            key,
            "expected an object like { \"provider\": \"local\", \"id\": \"judge\", \"type\": \"classifier\" }".into(),
        )
    })?;
    let mut m = RawModel {
        key: key.to_string(),
        ..Default::default()
    };
    for (field, value) in obj {
        let at = format!("{key}.{field}");
        match field.as_str() {
            "provider" => m.provider = non_empty(value, &at, bad)?,
            "id" => m.id = non_empty(value, &at, bad)?,
            "enabled" => m.enabled = Some(bool_of(value, &at, bad)?),
            "name" => m.name = Some(string_of(value, &at, bad)?),
            "type" => {
                let t = string_of(value, &at, bad)?;
                if !MODEL_TYPES.contains(&t.as_str()) {
                    return Err(bad(
                        &at,
                        format!("unknown type {t:?}; use \"classifier\", \"image\" or \"chat\""),
                    ));
                }
                m.model_type = Some(t);
            }
            "input" => m.input = Some(input_of(value, &at, bad)?),
            "price" => m.price = Some(price_of(value, &at, bad)?),
            _ => {
                return Err(bad(
                    &at,
                    "unknown key; a model has provider, id, name, type, input, price and enabled"
                        .into(),
                ));
            }
        }
    }
    if m.provider.is_empty() {
        return Err(bad(
            &format!("{key}.provider"),
            "missing; name the model's provider".into(),
        ));
    }
    if m.id.is_empty() {
        return Err(bad(
            &format!("{key}.id"),
            "missing; give the provider's model id".into(),
        ));
    }
    Ok(m)
}

fn input_of(value: &Value, at: &str, bad: &Bad<'_>) -> Result<Vec<String>, Problem> {
    let items = value.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        bad(
            at,
            "expected a non-empty array such as [\"text\", \"image\"]".into(),
        )
    })?;
    let mut kinds = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item
            .as_str()
            .filter(|k| INPUT_KINDS.contains(k))
            .ok_or_else(|| {
                bad(
                    &format!("{at}[{i}]"),
                    format!("expected \"text\" or \"image\", got {item}"),
                )
            })?;
        if !kinds.iter().any(|k| k == kind) {
            kinds.push(kind.to_string());
        }
    }
    Ok(kinds)
}

fn price_of(value: &Value, at: &str, bad: &Bad<'_>) -> Result<RawPrice, Problem> {
    let obj: &Map<String, Value> = value.as_object().ok_or_else(|| {
        bad(
            at,
            "expected { \"input\": <USD per million input tokens>, \"output\": <USD per million output tokens>, \"image\": <USD per image> }".into(),
        )
    })?;
    let mut price = RawPrice::default();
    for (field, v) in obj {
        let fat = format!("{at}.{field}");
        let n = v
            .as_f64()
            .filter(|n| n.is_finite() && *n >= 0.0)
            .ok_or_else(|| bad(&fat, format!("expected a non-negative number, got {v}")))?;
        match field.as_str() {
            "input" => price.input = Some(n),
            "output" => price.output = Some(n),
            "image" => price.image = Some(n),
            _ => {
                return Err(bad(
                    &fat,
                    "unknown key; a price has input, output and image".into(),
                ));
            }
        }
    }
    Ok(price)
}

fn string_of(value: &Value, at: &str, bad: &Bad<'_>) -> Result<String, Problem> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| bad(at, format!("expected a string, got {value}")))
}

fn non_empty(value: &Value, at: &str, bad: &Bad<'_>) -> Result<String, Problem> {
    let s = string_of(value, at, bad)?;
    if s.trim().is_empty() {
        return Err(bad(at, "must not be empty".into()));
    }
    Ok(s)
}

fn bool_of(value: &Value, at: &str, bad: &Bad<'_>) -> Result<bool, Problem> {
    value
        .as_bool()
        .ok_or_else(|| bad(at, format!("expected true or false, got {value}")))
}
