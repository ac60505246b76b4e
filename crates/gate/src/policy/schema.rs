//! The Cedar schema policies are validated against, generated from the registry.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::registry::Registry;

use super::PolicyError;

/// The Cedar type an argument gets in `context.args`. Arguments of other types are only in
/// `context.args_json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgType {
    String,
    Long,
    Bool,
    StringSet,
    /// A name tools declare with different types: a `String` holding the value's JSON text
    /// (a string as itself), so the name stays in the policies' sight for every tool.
    Text,
}

impl ArgType {
    fn cedar(self) -> &'static str {
        match self {
            ArgType::String | ArgType::Text => "String",
            ArgType::Long => "Long",
            ArgType::Bool => "Bool",
            ArgType::StringSet => "Set<String>",
        }
    }

    fn from_schema(prop: &Value) -> Option<ArgType> {
        match prop.get("type")?.as_str()? {
            "string" => Some(ArgType::String),
            "integer" => Some(ArgType::Long),
            "boolean" => Some(ArgType::Bool),
            "array" => (prop.get("items")?.get("type")?.as_str()? == "string")
                .then_some(ArgType::StringSet),
            _ => None,
        }
    }

    /// The Cedar JSON form of `v`, when `v` has this type.
    pub(crate) fn encode(self, v: &Value) -> Option<Value> {
        match (self, v) {
            (ArgType::String, Value::String(_)) | (ArgType::Bool, Value::Bool(_)) => {
                Some(v.clone())
            }
            (ArgType::Long, Value::Number(n)) => n.as_i64().map(Value::from),
            (ArgType::StringSet, Value::Array(items)) => items
                .iter()
                .all(Value::is_string)
                .then(|| Value::Array(items.clone())),
            (ArgType::Text, Value::String(_)) => Some(v.clone()),
            (ArgType::Text, other) => Some(Value::String(other.to_string())),
            _ => None,
        }
    }
}

/// The generated Cedar schema together with the argument types it declares.
///
/// `context.args` is typed from the top-level properties of every registered tool's input
/// schema (string, integer, boolean, array of strings), each optional. A name the tools
/// registered in this process (the built-ins) declare keeps their type whatever an MCP server
/// declares: a red team listed a tool with `command: integer`, the name was dropped, and a
/// `forbid … when { context.args has command && … }` on the built-in `bash` silently stopped
/// applying. A call whose value does not have the type is shown without it. A name only MCP
/// tools declare, with different types, is a `String` holding each value's JSON text, so it
/// never leaves the policies' sight; a policy comparing it as another type stops validating
/// (and the last policies that did stay in force). [`PolicySchema::conflicts`] names each
/// such name for a warning.
#[derive(Clone)]
pub struct PolicySchema {
    text: String,
    pub(crate) schema: cedar_policy::Schema,
    pub(crate) args: BTreeMap<String, ArgType>,
    conflicts: Vec<String>,
}

/// What the tools declare for one argument name: the distinct types (`None`: one Cedar has
/// no type for, such as an object), the built-ins' and everyone's.
#[derive(Default)]
struct Declared {
    builtin: Vec<Option<ArgType>>,
    any: Vec<Option<ArgType>>,
    /// Tools declaring it, for the warning.
    tools: Vec<String>,
}

fn merge(seen: &mut Vec<Option<ArgType>>, ty: Option<ArgType>) {
    if !seen.contains(&ty) {
        seen.push(ty);
    }
}

impl PolicySchema {
    /// Builds the schema for the tools registered now.
    pub fn for_registry(registry: &Registry) -> Result<PolicySchema, PolicyError> {
        let mut declared: BTreeMap<String, Declared> = BTreeMap::new();
        for spec in registry.specs() {
            let schema = spec.input_schema.value();
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                continue;
            };
            for (name, prop) in props {
                if !cedar_quotable(name) {
                    continue;
                }
                let ty = ArgType::from_schema(prop);
                let d = declared.entry(name.clone()).or_default();
                if spec.namespace.is_none() {
                    merge(&mut d.builtin, ty);
                }
                merge(&mut d.any, ty);
                if d.tools.len() < 8 {
                    d.tools.push(spec.name.clone());
                }
            }
        }
        let mut args = BTreeMap::new();
        let mut conflicts = Vec::new();
        for (name, d) in declared {
            let ty = match (d.builtin.as_slice(), d.any.as_slice()) {
                ([builtin], _) => *builtin,
                // The built-ins disagree among themselves: left out, as it always was.
                ([_, ..], _) => None,
                (_, [only]) => *only,
                // Dropped, the name would vanish from every call's context, and a `forbid`
                // guarded by `has` would stop applying unseen (a server could do that to
                // another's tools): it stays, as text.
                (_, [_, _, ..]) => {
                    conflicts.push(format!(
                        "`context.args.{name}` is a String of each value's JSON text: tools declare it with different types ({}); a policy comparing it as another type no longer validates",
                        d.tools.join(", ")
                    ));
                    Some(ArgType::Text)
                }
                (_, []) => None,
            };
            if let Some(ty) = ty {
                args.insert(name, ty);
            }
        }
        let text = schema_text(&args);
        let (schema, _warnings) = cedar_policy::Schema::from_cedarschema_str(&text)
            .map_err(|e| PolicyError::Schema(format!("{e}")))?;
        Ok(PolicySchema {
            text,
            schema,
            args,
            conflicts,
        })
    }

    /// Argument names typed as text because the tools disagree on their type, in words.
    pub fn conflicts(&self) -> &[String] {
        &self.conflicts
    }

    /// The `.cedarschema` text, for `codemode policy schema` and for editors.
    pub fn text(&self) -> &str {
        &self.text
    }
}

fn cedar_quotable(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| !c.is_control() && c != '"' && c != '\\')
}

fn schema_text(args: &BTreeMap<String, ArgType>) -> String {
    let mut arg_fields = String::new();
    for (name, ty) in args {
        arg_fields.push_str(&format!("  \"{name}\"?: {},\n", ty.cedar()));
    }
    format!(
        r#"// Generated by codemode-gate. Every call is one request:
//   principal = Session::"<session id>"
//   action    = Action::"tool_call" | Action::"model_call" | Action::"global_call"
//   resource  = Tool::"<tool name>" (tool and global calls) or Model::"<provider>/<id>" (model calls)
entity Session;

entity Tool = {{
  name: String,
  namespace: String,
  exposure: String,
  kind: String,
  read_only: Bool,
  destructive: Bool,
  idempotent: Bool,
  open_world: Bool,
}};

entity Model = {{
  provider: String,
  id: String,
  "type": String,
  input_price: decimal,
  output_price: decimal,
  image_price: decimal,
}};

// Top-level arguments of the registered tools, typed where Cedar can hold them.
type Args = {{
{arg_fields}}};

// What was spent so far (before this call). Cost in micro-USD.
type Counts = {{
  calls: Long,
  model_calls: Long,
  tokens: Long,
  cost_micro_usd: Long,
}};

type CallContext = {{
  args: Args,
  args_json: String,
  // Every resolved path the call touches; the policy is evaluated once per path, with that
  // path in `path` ("" when the call touches none).
  paths: Set<String>,
  path: String,
  origin: String,
  depth: Long,
  parent: String,
  script_id: String,
  // SHA-256 of the running script; for the `codemode` call, of the script it starts.
  script_hash: String,
  // For the `codemode` call: the script's size in bytes (0 for other calls).
  script_bytes: Long,
  // Whether `path` is the workspace root or beneath it (false when the call touches no path).
  in_workspace: Bool,
  client: String,
  script: Counts,
  session: Counts,
}};

action tool_call appliesTo {{ principal: Session, resource: Tool, context: CallContext }};
action global_call appliesTo {{ principal: Session, resource: Tool, context: CallContext }};
action model_call appliesTo {{ principal: Session, resource: Model, context: CallContext }};
"#
    )
}
