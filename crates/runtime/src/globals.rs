//! The script's globals besides `tools`: which are read-only helpers answered here, and which
//! carry authority and therefore go to the gate.

use codemode_declarations::{SearchOptions, ToolIndex};
use codemode_models::Catalog;
use serde_json::{Value, json};

/// Globals that only read what the script could already learn (the tool list, the model catalog
/// without keys or URLs). They are answered without the gate because they spend nothing and touch
/// nothing; every other global is a registered tool of kind model or global and passes the gate.
pub const READ_ONLY_GLOBALS: &[&str] = &[
    "searchTools",
    "describeTool",
    "describeNamespace",
    "models.getModelsOfType",
    "models.getAvailableOfType",
    "models.getModelOfType",
];

/// The model-catalog readers; present only when the models API is on.
pub(crate) const MODEL_READERS: &[&str] = &[
    "models.getModelsOfType",
    "models.getAvailableOfType",
    "models.getModelOfType",
];

/// The discovery helpers every script has.
pub(crate) const DISCOVERY: &[&str] = &["searchTools", "describeTool", "describeNamespace"];

/// Answers a read-only global. `None` means the name is not one of them.
pub(crate) fn answer(
    name: &str,
    args: &[Value],
    index: &ToolIndex,
    catalog: Option<&Catalog>,
) -> Option<Result<Value, String>> {
    let result = match name {
        "searchTools" => search(args, index),
        "describeTool" => describe_tool(args, index),
        "describeNamespace" => match args.first() {
            Some(Value::String(n)) => index.describe_namespace(n).map_err(|e| e.to_string()),
            _ => Err("describeNamespace() expects a namespace name as a string, for example describeNamespace(\"mcp__github\")".into()),
        },
        "models.getModelsOfType" | "models.getAvailableOfType" | "models.getModelOfType" => {
            let Some(catalog) = catalog else {
                return Some(Err("the models API is switched off in this installation".into()));
            };
            models_reader(name, args, catalog)
        }
        _ => return None,
    };
    Some(result)
}

/// `describeTool(name)`: the tool's text and declaration; `describeTool(name, {schema: true})`:
/// its input JSON Schema. An unknown name throws, naming the closest tools.
fn describe_tool(args: &[Value], index: &ToolIndex) -> Result<Value, String> {
    let Some(Value::String(name)) = args.first() else {
        return Err(
            "describeTool() expects a tool name as a string, for example describeTool(\"read\")"
                .into(),
        );
    };
    let schema = match args.get(1) {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            if let Some(key) = o.keys().find(|k| k.as_str() != "schema") {
                return Err(format!(
                    "describeTool() knows one option, `schema`; got `{key}`. Pass {{ schema: true }} for the input JSON Schema"
                ));
            }
            match o.get("schema") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(v) => {
                    return Err(format!(
                        "describeTool() option `schema` must be true or false, got {v}"
                    ));
                }
            }
        }
        Some(v) => {
            return Err(format!(
                "describeTool() options must be an object like {{ schema: true }}, got {v}"
            ));
        }
    };
    let described = if schema {
        index.input_schema(name)
    } else {
        index.describe_tool(name).map(Value::String)
    };
    described.map_err(|e| e.to_string())
}

fn search(args: &[Value], index: &ToolIndex) -> Result<Value, String> {
    let query = match args.first() {
        Some(Value::String(q)) => q.as_str(),
        _ => return Err("searchTools() expects a query string first, for example searchTools(\"read a file\", { limit: 5 })".into()),
    };
    let mut opts = SearchOptions::default();
    match args.get(1) {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            match o.get("limit") {
                None | Some(Value::Null) => {}
                Some(v) => match v.as_u64() {
                    Some(n) if n > 0 => opts.limit = n as usize,
                    _ => {
                        return Err(format!(
                            "searchTools() limit must be a positive integer, got {v}"
                        ));
                    }
                },
            }
            match o.get("namespace") {
                None | Some(Value::Null) => {}
                Some(Value::String(ns)) => opts.namespace = Some(ns.clone()),
                Some(v) => {
                    return Err(format!("searchTools() namespace must be a string, got {v}"));
                }
            }
        }
        Some(v) => {
            return Err(format!(
                "searchTools() options must be an object like {{ limit: 5, namespace: \"mcp__docs\" }}, got {v}"
            ));
        }
    }
    let hits = index.search(query, &opts).map_err(|e| e.to_string())?;
    Ok(Value::Array(
        hits.into_iter()
            .map(|h| json!({ "name": h.identifier, "description": h.description }))
            .collect(),
    ))
}

fn models_reader(name: &str, args: &[Value], catalog: &Catalog) -> Result<Value, String> {
    let str_arg = |i: usize| args.get(i).and_then(Value::as_str);
    let result = match name {
        "models.getModelsOfType" | "models.getAvailableOfType" => {
            let Some(ty) = str_arg(0) else {
                return Err(format!(
                    "{name}(type) expects a model type: \"classifier\", \"image\" or \"chat\""
                ));
            };
            if name == "models.getModelsOfType" {
                catalog.models_of_type(ty).map(Value::Array)
            } else {
                catalog.available_of_type(ty).map(Value::Array)
            }
        }
        _ => {
            let (Some(ty), Some(provider), Some(id)) = (str_arg(0), str_arg(1), str_arg(2)) else {
                return Err("models.getModelOfType(type, provider, id) expects three strings; the provider and the id are separate arguments".into());
            };
            catalog
                .model_of_type(ty, provider, id)
                .map(|m| m.unwrap_or(Value::Null))
        }
    };
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_spec::{NamespaceSpec, ToolSpec};

    fn index() -> ToolIndex {
        let mut read = ToolSpec::new(
            "mcp__fs__read_text_file",
            "Read a file as text.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        );
        read.namespace = Some("mcp__fs".into());
        let echo = ToolSpec::new("echo", "Echo text back.", json!({"type": "object"}));
        let ns = NamespaceSpec {
            name: "mcp__fs".into(),
            description: Some("Files".into()),
            instructions: None,
            unavailable: None,
        };
        ToolIndex::new(&[read, echo], &[ns])
    }

    fn ask(name: &str, args: Value) -> Result<Value, String> {
        let args = args.as_array().cloned().unwrap_or_default();
        answer(name, &args, &index(), None).expect("a read-only global")
    }

    #[test]
    fn describe_tool_throws_for_unknown_names_with_the_closest() {
        let err = ask("describeTool", json!(["mcp__fs__read_txt_file"])).unwrap_err();
        assert!(
            err.contains("no tool is named")
                && err.contains("Closest: tools.mcp__fs__read_text_file"),
            "{err}"
        );
        let err = ask("describeTool", json!(["zzzzzz"])).unwrap_err();
        assert!(
            err.contains("None is close") && err.contains("searchTools("),
            "{err}"
        );
        let text = ask("describeTool", json!(["read_text_file"]));
        assert!(
            text.is_err(),
            "a local name alone is not a tool name: {text:?}"
        );
        let text = ask("describeTool", json!(["mcp__fs__read_text_file"])).unwrap();
        assert!(text.as_str().unwrap().starts_with("Read a file as text."));
    }

    #[test]
    fn describe_tool_returns_the_input_schema_on_request() {
        let schema = ask(
            "describeTool",
            json!(["mcp__fs__read_text_file", {"schema": true}]),
        )
        .unwrap();
        assert_eq!(schema["required"], json!(["path"]));
        // `schema: false` and no options are the text.
        for args in [
            json!(["echo", {"schema": false}]),
            json!(["echo", null]),
            json!(["echo"]),
        ] {
            assert!(ask("describeTool", args).unwrap().is_string());
        }
        for (args, expected) in [
            (
                json!(["echo", {"schma": true}]),
                "knows one option, `schema`; got `schma`",
            ),
            (
                json!(["echo", {"schema": "yes"}]),
                "`schema` must be true or false",
            ),
            (
                json!(["echo", true]),
                "options must be an object like { schema: true }",
            ),
            (json!([42]), "expects a tool name as a string"),
            (
                json!(["nope", {"schema": true}]),
                "no tool is named \"nope\"",
            ),
        ] {
            let err = ask("describeTool", args.clone()).unwrap_err();
            assert!(err.contains(expected), "{args}: {err}");
        }
    }

    #[test]
    fn describe_namespace_throws_for_unknown_names() {
        let ns = ask("describeNamespace", json!(["fs"])).unwrap();
        assert_eq!(ns["tools"], json!(["mcp__fs__read_text_file"]));
        let err = ask("describeNamespace", json!(["mcp__fz"])).unwrap_err();
        assert!(
            err.contains("no namespace is named") && err.contains("mcp__fs"),
            "{err}"
        );
    }
}
