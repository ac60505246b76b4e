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
        "describeTool" => match args.first() {
            Some(Value::String(n)) => Ok(index.describe_tool(n).map(Value::String).unwrap_or(Value::Null)),
            _ => Err("describeTool() expects a tool name as a string, for example describeTool(\"read\")".into()),
        },
        "describeNamespace" => match args.first() {
            Some(Value::String(n)) => Ok(index.describe_namespace(n).unwrap_or(Value::Null)),
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
