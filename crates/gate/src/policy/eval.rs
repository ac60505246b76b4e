//! Turning one call into a Cedar request, and Cedar's answer into a decision.

use std::str::FromStr;

use std::collections::HashSet;

use cedar_policy::{
    Authorizer, Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, Request,
    RestrictedExpression,
};
use codemode_spec::{
    Annotations, CallFacts, CallKind, Exposure, ModelFacts, Origin, Provenance, ToolSpec,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::PolicySet;
use super::schema::{ArgType, PolicySchema};

/// What was spent before this call, as policies see it (`context.script`, `context.session`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counts {
    pub calls: u64,
    pub model_calls: u64,
    pub tokens: u64,
    pub cost_micro_usd: u64,
}

/// Everything the policy decides one call on.
pub struct PolicyInput<'a> {
    pub spec: &'a ToolSpec,
    pub args: &'a Value,
    pub facts: &'a CallFacts,
    pub provenance: &'a Provenance,
    pub script: Counts,
    pub session: Counts,
    /// The workspace root (absolute, symlinks resolved), for `context.in_workspace`.
    pub workspace: Option<&'a str>,
}

/// Whether `path` is the workspace root or beneath it.
pub(crate) fn in_workspace(workspace: Option<&str>, path: &str) -> bool {
    let Some(root) = workspace else {
        return false;
    };
    !path.is_empty() && std::path::Path::new(path).starts_with(root)
}

/// The policy's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow {
        policy_ids: Vec<String>,
    },
    /// A permitting policy carries `@ask`: a person (the approver) must agree.
    Ask {
        reason: String,
        policy_ids: Vec<String>,
    },
    Deny {
        message: String,
        policy_ids: Vec<String>,
    },
}

impl Decision {
    pub fn policy_ids(&self) -> &[String] {
        match self {
            Decision::Allow { policy_ids }
            | Decision::Ask { policy_ids, .. }
            | Decision::Deny { policy_ids, .. } => policy_ids,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Allow { .. } => "allow",
            Decision::Ask { .. } => "ask",
            Decision::Deny { .. } => "deny",
        }
    }
}

pub(crate) fn action_name(kind: CallKind) -> &'static str {
    match kind {
        CallKind::Tool => "tool_call",
        CallKind::Model => "model_call",
        CallKind::Global => "global_call",
    }
}

fn uid(ty: &str, id: &str) -> Result<EntityUid, String> {
    let ty = EntityTypeName::from_str(ty).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(ty, EntityId::new(id)))
}

// The entities and the context are built as Cedar values directly: going through Cedar's JSON
// format cost about half of the gate's time per call (its parser tries each form of a value in
// turn and formats an error for every miss).

fn string(s: impl Into<String>) -> RestrictedExpression {
    RestrictedExpression::new_string(s.into())
}

fn long(v: u64) -> RestrictedExpression {
    RestrictedExpression::new_long(i64::try_from(v).unwrap_or(i64::MAX))
}

fn decimal(v: f64) -> RestrictedExpression {
    let v = if v.is_finite() {
        v.clamp(-9.0e14, 9.0e14)
    } else {
        0.0
    };
    RestrictedExpression::new_decimal(format!("{v:.4}"))
}

fn record<const N: usize>(
    fields: [(&str, RestrictedExpression); N],
) -> Result<RestrictedExpression, String> {
    RestrictedExpression::new_record(fields.map(|(k, v)| (k.to_string(), v)))
        .map_err(|e| format!("cannot describe the call to the policy engine: {e}"))
}

fn model_id(m: &ModelFacts) -> String {
    format!("{}/{}", m.provider, m.id)
}

/// Most items of one argument the policy engine is given as a set. A Cedar set costs about 240
/// bytes an item (its expression, then its value twice); past this, a call is refused rather
/// than decided on part of its argument.
const MAX_POLICY_SET: usize = 65_536;

/// Args as a Cedar record: only arguments the schema types, and only when the value has that
/// type. With no schema, the value's own type decides. An argument too big to give the policy
/// engine is an error, which refuses the call.
fn args_record(
    spec: &ToolSpec,
    args: &Value,
    schema: Option<&PolicySchema>,
) -> Result<Vec<(String, RestrictedExpression)>, String> {
    let mut out = Vec::new();
    if let Some(obj) = args.as_object() {
        for (k, v) in obj {
            let ty = match schema {
                Some(s) => s.args.get(k).copied(),
                None => match v {
                    Value::String(_) => Some(ArgType::String),
                    Value::Bool(_) => Some(ArgType::Bool),
                    Value::Number(_) => Some(ArgType::Long),
                    Value::Array(_) => Some(ArgType::StringSet),
                    _ => None,
                },
            };
            if ty == Some(ArgType::StringSet)
                && let Value::Array(items) = v
                && items.len() > MAX_POLICY_SET
            {
                return Err(format!(
                    "`{}` was refused: its argument `{k}` holds {} items, and the policies read it as a set of at most {MAX_POLICY_SET}. No person was asked. Pass fewer at once (split the call)",
                    spec.name,
                    items.len()
                ));
            }
            if let Some(enc) = ty.and_then(|t| t.encode(v)).and_then(|e| cedar_value(&e)) {
                out.push((k.clone(), enc));
            }
        }
    }
    Ok(out)
}

/// One encoded argument (see `ArgType::encode`: a string, a boolean, a long or a set of strings)
/// as a Cedar value.
fn cedar_value(v: &Value) -> Option<RestrictedExpression> {
    match v {
        Value::String(s) => Some(string(s.as_str())),
        Value::Bool(b) => Some(RestrictedExpression::new_bool(*b)),
        Value::Number(n) => n.as_i64().map(RestrictedExpression::new_long),
        Value::Array(items) => items
            .iter()
            .map(cedar_value)
            .collect::<Option<Vec<_>>>()
            .map(RestrictedExpression::new_set),
        _ => None,
    }
}

fn counts_record(c: &Counts) -> Result<RestrictedExpression, String> {
    record([
        ("calls", long(c.calls)),
        ("model_calls", long(c.model_calls)),
        ("tokens", long(c.tokens)),
        ("cost_micro_usd", long(c.cost_micro_usd)),
    ])
}

fn entity(
    uid: EntityUid,
    attrs: impl IntoIterator<Item = (&'static str, RestrictedExpression)>,
) -> Result<Entity, String> {
    let attrs = attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Entity::new(uid, attrs, HashSet::new())
        .map_err(|e| format!("cannot describe the call to the policy engine: {e}"))
}

fn resource_entity(spec: &ToolSpec, model: Option<&ModelFacts>) -> Result<Entity, String> {
    if spec.kind == CallKind::Model {
        let m = model.ok_or_else(|| {
            format!(
                "model call `{}` did not say which model it spends on (its facts() returned no model); the call is denied",
                spec.name
            )
        })?;
        let id = model_id(m);
        return entity(
            uid("Model", &id)?,
            [
                ("provider", string(m.provider.as_str())),
                ("id", string(m.id.as_str())),
                ("type", string(m.model_type.as_str())),
                ("input_price", decimal(m.input_price)),
                ("output_price", decimal(m.output_price)),
                ("image_price", decimal(m.image_price)),
            ],
        );
    }
    let a: &Annotations = &spec.annotations;
    let read_only = a.read_only_hint.unwrap_or(false);
    let kind = match spec.kind {
        CallKind::Tool => "tool",
        CallKind::Model => "model",
        CallKind::Global => "global",
    };
    entity(
        uid("Tool", &spec.name)?,
        [
            ("name", string(spec.name.as_str())),
            (
                "namespace",
                string(spec.namespace.clone().unwrap_or_default()),
            ),
            ("exposure", string(spec.exposure.as_str())),
            ("kind", string(kind)),
            ("read_only", RestrictedExpression::new_bool(read_only)),
            // MCP's defaults for absent hints: a tool that is not read-only may destroy, and
            // may reach the open world.
            (
                "destructive",
                RestrictedExpression::new_bool(a.destructive_hint.unwrap_or(!read_only)),
            ),
            (
                "idempotent",
                RestrictedExpression::new_bool(a.idempotent_hint.unwrap_or(false)),
            ),
            (
                "open_world",
                RestrictedExpression::new_bool(a.open_world_hint.unwrap_or(true)),
            ),
        ],
    )
}
/// Asks the policies about one call. Any failure to build or evaluate the request denies.
pub(crate) fn decide(
    policies: &PolicySet,
    schema: Option<&PolicySchema>,
    input: &PolicyInput<'_>,
) -> Decision {
    // Cedar cannot say "every element of a set is like ...", so a call that touches several
    // paths is decided once per path (`context.path`); the strictest answer wins.
    let paths: Vec<&str> = if input.facts.paths.is_empty() {
        vec![""]
    } else {
        input.facts.paths.iter().map(String::as_str).collect()
    };
    let mut allowed: Vec<String> = Vec::new();
    let mut ask: Option<(Vec<String>, Vec<String>)> = None;
    for path in paths {
        let decision = match evaluate(policies, schema, input, path) {
            Ok(d) => d,
            Err(message) => Decision::Deny {
                message,
                policy_ids: Vec::new(),
            },
        };
        match decision {
            Decision::Deny { .. } => return decision,
            Decision::Ask { reason, policy_ids } => {
                let (reasons, ids) = ask.get_or_insert_with(Default::default);
                if !reasons.contains(&reason) {
                    reasons.push(reason);
                }
                merge_ids(ids, policy_ids);
            }
            Decision::Allow { policy_ids } => merge_ids(&mut allowed, policy_ids),
        }
    }
    match ask {
        Some((reasons, policy_ids)) => Decision::Ask {
            reason: reasons.join("; "),
            policy_ids,
        },
        None => Decision::Allow {
            policy_ids: allowed,
        },
    }
}

fn merge_ids(into: &mut Vec<String>, ids: Vec<String>) {
    for id in ids {
        if !into.contains(&id) {
            into.push(id);
        }
    }
}

fn evaluate(
    policies: &PolicySet,
    schema: Option<&PolicySchema>,
    input: &PolicyInput<'_>,
    path: &str,
) -> Result<Decision, String> {
    let p = input.provenance;
    let principal = uid("Session", &p.session_id)?;
    let action = uid("Action", action_name(input.spec.kind))?;
    let resource = resource_entity(input.spec, input.facts.model.as_ref())?;
    let resource_uid = resource.uid();
    let entities = Entities::from_entities(
        [
            Entity::new_no_attrs(principal.clone(), HashSet::new()),
            resource,
        ],
        None,
    )
    .map_err(|e| format!("cannot describe the call to the policy engine: {e}"))?;
    let origin = match p.origin {
        Origin::Model => "model",
        Origin::Script => "script",
        Origin::Client => "client",
    };
    let script_hash = input
        .facts
        .script
        .as_ref()
        .map(|s| s.sha256.clone())
        .or_else(|| p.script_hash.clone())
        .unwrap_or_default();
    // Fields no policy reads are left empty: they cost by the arguments' size (see `reads`).
    let args = match policies.reads.args {
        true => args_record(input.spec, input.args, schema)?,
        false => Vec::new(),
    };
    let args = RestrictedExpression::new_record(args)
        .map_err(|e| format!("cannot describe the call's arguments to the policy engine: {e}"))?;
    let args_json = match policies.reads.args_json {
        true => serde_json::to_string(input.args).unwrap_or_default(),
        false => String::new(),
    };
    let context = Context::from_pairs([
        ("args".to_string(), args),
        ("args_json".to_string(), string(args_json)),
        (
            "paths".to_string(),
            RestrictedExpression::new_set(input.facts.paths.iter().map(|p| string(p.as_str()))),
        ),
        ("path".to_string(), string(path)),
        ("origin".to_string(), string(origin)),
        ("depth".to_string(), long(u64::from(p.depth))),
        (
            "parent".to_string(),
            string(p.parent_call_id.clone().unwrap_or_default()),
        ),
        (
            "script_id".to_string(),
            string(p.script_id.clone().unwrap_or_default()),
        ),
        ("script_hash".to_string(), string(script_hash)),
        (
            "script_bytes".to_string(),
            long(input.facts.script.as_ref().map_or(0, |s| s.bytes)),
        ),
        (
            "in_workspace".to_string(),
            RestrictedExpression::new_bool(in_workspace(input.workspace, path)),
        ),
        (
            "client".to_string(),
            string(p.client.clone().unwrap_or_default()),
        ),
        ("script".to_string(), counts_record(&input.script)?),
        ("session".to_string(), counts_record(&input.session)?),
    ])
    .map_err(|e| format!("cannot describe the call's context to the policy engine: {e}"))?;
    let resource = resource_uid;
    let request = Request::new(principal, action, resource, context, None)
        .map_err(|e| format!("cannot build the policy request: {e}"))?;
    let response = Authorizer::new().is_authorized(&request, &policies.cedar, &entities);

    let errors: Vec<(String, String)> = response
        .diagnostics()
        .errors()
        .map(|e| match e {
            cedar_policy::AuthorizationError::PolicyEvaluationError(pe) => {
                (pe.policy_id().to_string(), e.to_string())
            }
        })
        .collect();
    if !errors.is_empty() {
        // A policy that cannot be evaluated might have been a forbid; fail closed.
        let ids: Vec<String> = errors.iter().map(|(id, _)| id.clone()).collect();
        let detail: Vec<String> = errors
            .iter()
            .map(|(id, e)| format!("`{id}`: {e}"))
            .collect();
        return Ok(Decision::Deny {
            message: format!(
                "{} was refused because a policy could not be evaluated ({}). No person was asked. Tell the user the policy needs fixing",
                describe_call(input.spec, input.facts.model.as_ref()),
                detail.join("; ")
            ),
            policy_ids: ids,
        });
    }
    let ids: Vec<String> = response
        .diagnostics()
        .reason()
        .map(|id| id.to_string())
        .collect();
    let what = describe_call(input.spec, input.facts.model.as_ref());
    Ok(match response.decision() {
        cedar_policy::Decision::Allow => {
            let asks: Vec<(&str, &str)> = ids
                .iter()
                .filter_map(|id| {
                    policies
                        .info(id)
                        .and_then(|i| i.ask.as_deref().map(|a| (id.as_str(), a)))
                })
                .collect();
            if asks.is_empty() {
                Decision::Allow { policy_ids: ids }
            } else {
                let reason = asks
                    .iter()
                    .map(|(id, a)| format!("{a} (policy `{id}`)"))
                    .collect::<Vec<_>>()
                    .join("; ");
                Decision::Ask {
                    reason,
                    policy_ids: asks.iter().map(|(id, _)| id.to_string()).collect(),
                }
            }
        }
        cedar_policy::Decision::Deny if ids.is_empty() => Decision::Deny {
            message: format!(
                "no policy permits {what}, so it was refused. No person was asked. Do not retry it; if it should run, ask the user to add a permit policy for it"
            ),
            policy_ids: ids,
        },
        cedar_policy::Decision::Deny => Decision::Deny {
            message: format!(
                "{what} is forbidden by policy {}, so it was refused. No person was asked. Do not retry it; find another way, or ask the user to change the policy",
                ids.iter()
                    .map(|i| format!("`{i}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            policy_ids: ids,
        },
    })
}

fn describe_call(spec: &ToolSpec, model: Option<&ModelFacts>) -> String {
    match (spec.kind, model) {
        (CallKind::Model, Some(m)) => format!("model call `{}` on `{}`", spec.name, model_id(m)),
        (CallKind::Global, _) => format!("global `{}`", spec.name),
        _ => format!("tool `{}`", spec.name),
    }
}

/// A call described in JSON, for `codemode policy explain CALL.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplainInput {
    pub tool: String,
    #[serde(default = "empty_object")]
    pub args: Value,
    #[serde(default = "tool_kind")]
    pub kind: CallKind,
    #[serde(default)]
    pub exposure: Exposure,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub annotations: Annotations,
    #[serde(default)]
    pub model: Option<ModelFacts>,
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default = "script_origin")]
    pub origin: Origin,
    #[serde(default = "one")]
    pub depth: u32,
    #[serde(default = "explain_session")]
    pub session_id: String,
    #[serde(default)]
    pub parent_call_id: Option<String>,
    #[serde(default)]
    pub script_hash: Option<String>,
    #[serde(default)]
    pub script: Counts,
    #[serde(default)]
    pub session: Counts,
    /// The workspace root, for `context.in_workspace`.
    #[serde(default)]
    pub workspace: Option<String>,
    /// For a `codemode` call: the script's SHA-256 and size.
    #[serde(default)]
    pub script_facts: Option<codemode_spec::ScriptFacts>,
}

fn empty_object() -> Value {
    json!({})
}
fn tool_kind() -> CallKind {
    CallKind::Tool
}
fn script_origin() -> Origin {
    Origin::Script
}
fn one() -> u32 {
    1
}
fn explain_session() -> String {
    "explain".into()
}

/// One policy that decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyReason {
    pub id: String,
    pub file: String,
    pub line: usize,
    pub effect: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
}

/// Which policies decided a call, and how.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// `allow`, `ask` or `deny`.
    pub decision: &'static str,
    /// One sentence for people.
    pub summary: String,
    pub policies: Vec<PolicyReason>,
}

/// Explains how `policies` decide the call described by `input`. With a schema, arguments are
/// typed as at run time; without one, by their JSON values.
pub fn explain(
    policies: &PolicySet,
    schema: Option<&PolicySchema>,
    input: &ExplainInput,
) -> Explanation {
    let mut spec = ToolSpec::new(input.tool.clone(), "", json!({}));
    spec.kind = input.kind;
    spec.exposure = input.exposure;
    spec.namespace = input.namespace.clone();
    spec.annotations = input.annotations.clone();
    let facts = CallFacts {
        paths: input.paths.clone(),
        model: input.model.clone(),
        script: input.script_facts.clone(),
        ..CallFacts::default()
    };
    let provenance = Provenance {
        call_id: "explain".into(),
        parent_call_id: input.parent_call_id.clone(),
        depth: input.depth,
        origin: input.origin,
        script_id: None,
        script_hash: input.script_hash.clone(),
        session_id: input.session_id.clone(),
        seq: None,
        client: None,
    };
    let decision = decide(
        policies,
        schema,
        &PolicyInput {
            spec: &spec,
            args: &input.args,
            facts: &facts,
            provenance: &provenance,
            script: input.script,
            session: input.session,
            workspace: input.workspace.as_deref(),
        },
    );
    let policies_out: Vec<PolicyReason> = decision
        .policy_ids()
        .iter()
        .map(|id| match policies.info(id) {
            Some(i) => PolicyReason {
                id: id.clone(),
                file: i.file.clone(),
                line: i.line,
                effect: if i.permit { "permit" } else { "forbid" },
                ask: i.ask.clone(),
            },
            None => PolicyReason {
                id: id.clone(),
                file: String::new(),
                line: 0,
                effect: "unknown",
                ask: None,
            },
        })
        .collect();
    let summary = match &decision {
        Decision::Allow { policy_ids } => format!("allowed by {}", policy_ids.join(", ")),
        Decision::Ask { reason, .. } => format!("approval required: {reason}"),
        Decision::Deny { message, .. } => message.clone(),
    };
    Explanation {
        decision: decision.as_str(),
        summary,
        policies: policies_out,
    }
}
