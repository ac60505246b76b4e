//! Cedar policies: loading, validation against the generated schema, and decisions.
//!
//! A permit policy annotated `@ask("reason")` turns an allow into "ask a person". Nothing is
//! allowed unless a policy permits it, and a policy that fails to evaluate denies the call.

mod complexity;
mod eval;
mod reads;
mod schema;

use std::path::Path;
use std::str::FromStr;

use cedar_policy::{Effect, PolicyId, ValidationMode, Validator};
use miette::Diagnostic;

pub(crate) use eval::decide;
pub use eval::{Counts, Decision, ExplainInput, Explanation, PolicyInput, PolicyReason, explain};
pub use schema::PolicySchema;

/// Default policies a new user can read and adapt: read-only tools permitted, writes and `bash`
/// asked, everything else denied.
pub const DEFAULT_POLICIES: &str = include_str!("../../policies/default.cedar");

/// What was wrong with a policy file, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{file}:{line}:{column}: syntax error: {message}")]
    Syntax {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}:{line}:{column}: policy `{policy_id}` does not fit the schema: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        policy_id: String,
        message: String,
    },
    #[error("{file}: policy id `{id}` is used twice; give each policy its own @id(\"...\")")]
    Duplicate { file: String, id: String },
    #[error(
        "{file}:{line}: policy `{policy_id}` is a permit, but this file may only narrow (forbid) because it comes from an untrusted project; trust the project or turn the policy into a forbid"
    )]
    NotForbidOnly {
        file: String,
        line: usize,
        policy_id: String,
    },
    #[error(
        "{file}:{line}: `{policy_id}` is a policy template (it uses ?principal or ?resource), which codemode never links, so it would never apply; write the entity in its place (`principal == Session::\"...\"`, `resource == Tool::\"...\"`) or drop the condition"
    )]
    Template {
        file: String,
        line: usize,
        policy_id: String,
    },
    #[error("the generated Cedar schema is invalid (a bug in codemode-gate): {0}")]
    Schema(String),
}

/// Facts about one policy, for explanations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyInfo {
    pub id: String,
    pub file: String,
    pub line: usize,
    pub permit: bool,
    pub ask: Option<String>,
}

/// A set of Cedar policies with where each came from.
#[derive(Clone, Default)]
pub struct PolicySet {
    pub(crate) cedar: cedar_policy::PolicySet,
    pub(crate) infos: Vec<PolicyInfo>,
    /// Source text per file, to turn validation spans into lines, and how its permits were taken.
    texts: Vec<(String, String, Permits)>,
    /// The costly context fields some policy reads: the others are not built.
    pub(crate) reads: reads::ContextReads,
}

/// What to do with the permit policies of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Permits {
    Keep,
    /// An error: the file may only narrow.
    Refuse,
    /// Left out (and reported): the file may only narrow.
    Skip,
}

impl std::fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySet")
            .field("policies", &self.infos)
            .finish()
    }
}

impl PolicySet {
    /// No policies: every call is denied.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The embedded default policies (also shipped as `crates/gate/policies/default.cedar`).
    pub fn defaults() -> Self {
        // The embedded file is checked by a test; failing here would be a build defect, and an
        // empty set still fails closed.
        Self::parse("default.cedar", DEFAULT_POLICIES).unwrap_or_default()
    }

    /// Parses policies from text; `file` names them in errors and ids.
    pub fn parse(file: &str, text: &str) -> Result<Self, PolicyError> {
        let mut set = PolicySet::default();
        set.add_source(file, text, false)?;
        Ok(set)
    }

    /// Adds policies from text; `file` names them in errors and ids. With `forbid_only`, any
    /// permit policy is an error.
    pub fn add_source(
        &mut self,
        file: &str,
        text: &str,
        forbid_only: bool,
    ) -> Result<(), PolicyError> {
        let permits = if forbid_only {
            Permits::Refuse
        } else {
            Permits::Keep
        };
        self.add_policies(file, text, permits).map(|_| ())
    }

    /// Adds only the `forbid` policies of `text` (an untrusted project's file, which may narrow
    /// but not widen), returning the id and line of each permit left out.
    pub fn add_forbids(
        &mut self,
        file: &str,
        text: &str,
    ) -> Result<Vec<(String, usize)>, PolicyError> {
        self.add_policies(file, text, Permits::Skip)
    }

    fn add_policies(
        &mut self,
        file: &str,
        text: &str,
        permits: Permits,
    ) -> Result<Vec<(String, usize)>, PolicyError> {
        complexity::check(file, text)?;
        let parsed = parse_with_room(text).map_err(|e| {
            let (line, column) = first_label(&*e, text);
            PolicyError::Syntax {
                file: file.to_string(),
                line,
                column,
                message: diagnostic_text(&*e),
            }
        })?;
        let short = Path::new(file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| file.to_string());
        let starts = policy_starts(text);
        // Cedar parses a template into a separate list; unlinked, it silently never applies.
        if let Some(template) = parsed.templates().next() {
            // Templates are numbered with the policies, in source order (`policy3`).
            let line = template
                .id()
                .to_string()
                .trim_start_matches("policy")
                .parse::<usize>()
                .ok()
                .and_then(|n| starts.get(n).copied())
                .unwrap_or(1);
            return Err(PolicyError::Template {
                file: file.to_string(),
                line,
                policy_id: template
                    .annotation("id")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{short} template")),
            });
        }
        // Policies come back keyed `policy0`, `policy1`, ... in source order.
        let mut policies: Vec<_> = parsed.policies().cloned().collect();
        policies.sort_by_key(|p| {
            p.id()
                .to_string()
                .trim_start_matches("policy")
                .parse::<usize>()
                .unwrap_or(usize::MAX)
        });
        let mut skipped = Vec::new();
        for (n, policy) in policies.into_iter().enumerate() {
            let id = policy
                .annotation("id")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{short}#{n}"));
            let line = starts.get(n).copied().unwrap_or(1);
            let permit = policy.effect() == Effect::Permit;
            if permit && permits == Permits::Refuse {
                return Err(PolicyError::NotForbidOnly {
                    file: file.to_string(),
                    line,
                    policy_id: id,
                });
            }
            if permit && permits == Permits::Skip {
                skipped.push((id, line));
                continue;
            }
            // `@Ask(…)` or `@ASK(…)` means what `@ask(…)` does: an annotation Cedar keeps but
            // codemode ignored would let the call run unasked.
            let ask = policy
                .annotations()
                .find(|(key, _)| key.eq_ignore_ascii_case("ask"))
                .map(|(_, value)| value.to_string());
            self.reads.add(&policy);
            self.cedar
                .add(policy.new_id(PolicyId::new(&id)))
                .map_err(|_| PolicyError::Duplicate {
                    file: file.to_string(),
                    id: id.clone(),
                })?;
            self.infos.push(PolicyInfo {
                id,
                file: file.to_string(),
                line,
                permit,
                ask,
            });
        }
        self.texts
            .push((file.to_string(), text.to_string(), permits));
        Ok(skipped)
    }

    /// Adds every policy of `other`.
    pub fn extend(&mut self, other: PolicySet) -> Result<(), PolicyError> {
        for (file, text, permits) in other.texts {
            self.add_policies(&file, &text, permits)?;
        }
        Ok(())
    }

    /// Ids of the policies, in load order.
    pub fn ids(&self) -> Vec<String> {
        self.infos.iter().map(|i| i.id.clone()).collect()
    }

    /// Every tool name the policies write out, as `Tool::"…"` or as a string compared with
    /// `resource.name` (`==`, or a set's `.contains`), in load order. Cedar accepts any name
    /// there; a name no tool has never matches, so a `forbid` written with an MCP tool's name as
    /// its server spells it (`delete-all` for the registered `delete_all`) would silently forbid
    /// nothing. Callers warn about those.
    pub fn tool_literals(&self) -> Vec<ToolLiteral> {
        let mut out = Vec::new();
        for info in &self.infos {
            let Some(policy) = self.cedar.policy(&PolicyId::new(&info.id)) else {
                continue;
            };
            let at = format!("{}:{} (policy `{}`)", info.file, info.line, info.id);
            for uid in policy.entity_literals() {
                if uid.type_name().to_string() == "Tool" {
                    let name = uid.id().unescaped().to_string();
                    out.push(ToolLiteral {
                        at: at.clone(),
                        written: format!("Tool::{:?}", name),
                        name,
                    });
                }
            }
            if let Ok(est) = policy.to_json() {
                let mut names = Vec::new();
                resource_name_literals(&est, &mut names);
                for name in names {
                    out.push(ToolLiteral {
                        at: at.clone(),
                        written: format!("resource.name {:?}", name),
                        name,
                    });
                }
            }
        }
        out
    }

    /// Type-checks every policy against the schema (strict mode). Reports the first problem with
    /// its file and line; a policy that reads an attribute that does not exist fails here rather
    /// than silently never matching.
    pub fn validate(&self, schema: &PolicySchema) -> Result<(), PolicyError> {
        let validator = Validator::new(schema.schema.clone());
        let result = validator.validate(&self.cedar, ValidationMode::Strict);
        // Warnings count as errors: a policy that can never apply (`context.args has typo`)
        // or that hides look-alike characters is a mistake that would silently not protect.
        let problem: Option<(String, &dyn Diagnostic)> = result
            .validation_errors()
            .next()
            .map(|e| (e.policy_id().to_string(), e as &dyn Diagnostic))
            .or_else(|| {
                result
                    .validation_warnings()
                    .next()
                    .map(|w| (w.policy_id().to_string(), w as &dyn Diagnostic))
            });
        if let Some((policy_id, err)) = problem {
            let (file, text) = self
                .infos
                .iter()
                .find(|i| i.id == policy_id)
                .and_then(|i| self.texts.iter().find(|(f, ..)| *f == i.file))
                .map(|(f, t, _)| (f.clone(), t.as_str()))
                .unwrap_or_default();
            let (line, column) = first_label(err, text);
            return Err(PolicyError::Invalid {
                file,
                line,
                column,
                policy_id,
                message: diagnostic_text(err),
            });
        }
        Ok(())
    }

    pub(crate) fn info(&self, id: &str) -> Option<&PolicyInfo> {
        self.infos.iter().find(|i| i.id == id)
    }
}

/// Parses and type-checks one policy file's text against the schema of `registry`'s tools, as
/// `codemode policy check FILE` does; `file` names it in errors.
pub fn check(file: &str, text: &str, registry: &crate::Registry) -> Result<(), PolicyError> {
    let set = PolicySet::parse(file, text)?;
    set.validate(&PolicySchema::for_registry(registry)?)
}

/// Message and help of a Cedar diagnostic, on one line.
fn diagnostic_text(d: &dyn Diagnostic) -> String {
    let mut out = d.to_string();
    if let Some(related) = d.related() {
        for r in related.take(3) {
            out.push_str("; ");
            out.push_str(&r.to_string());
        }
    }
    if let Some(help) = d.help() {
        out.push_str(&format!(" (hint: {help})"));
    }
    out
}

/// 1-based line and column of a diagnostic's first labelled span (searching related errors too).
fn first_label(d: &dyn Diagnostic, text: &str) -> (usize, usize) {
    let offset = d
        .labels()
        .and_then(|mut l| l.next())
        .map(|l| l.offset())
        .or_else(|| {
            d.related()
                .and_then(|mut r| r.find_map(|e| e.labels().and_then(|mut l| l.next())))
                .map(|l| l.offset())
        });
    match offset {
        Some(off) => line_col(text, off),
        None => (1, 1),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map(|s| s.chars().count())
        .unwrap_or(0)
        + 1;
    (line, column)
}

/// Line of each policy's first token (`permit`/`forbid` or its first annotation), in order.
/// Comments and string contents are skipped so a word inside them does not count.
/// Cedar's parse on a thread of its own with a large stack: within the bounds of `complexity`,
/// its recursion needs a few megabytes in a debug build, more than a tokio worker's 2 MiB.
fn parse_with_room(text: &str) -> Result<cedar_policy::PolicySet, Box<cedar_policy::ParseErrors>> {
    const PARSE_STACK: usize = 64 * 1024 * 1024;
    std::thread::scope(|scope| {
        let parse = std::thread::Builder::new()
            .name("cedar-parse".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(scope, || {
                cedar_policy::PolicySet::from_str(text).map_err(Box::new)
            });
        match parse {
            Ok(handle) => match handle.join() {
                Ok(parsed) => parsed,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            // No thread to be had: parse here, within the same bounds.
            Err(_) => cedar_policy::PolicySet::from_str(text).map_err(Box::new),
        }
    })
}

fn policy_starts(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at_policy_start = true;
    let mut line = 1;
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            '"' => in_string = true,
            ';' => at_policy_start = true,
            c if c.is_whitespace() => {}
            _ => {
                if at_policy_start {
                    starts.push(line);
                    at_policy_start = false;
                }
            }
        }
    }
    starts
}

/// A tool name written in a policy: where, the name, and how it is written there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLiteral {
    /// `file:line (policy `id`)`.
    pub at: String,
    pub name: String,
    /// `Tool::"x"` or `resource.name "x"`, for messages.
    pub written: String,
}

impl ToolLiteral {
    /// `name` written the way this literal is, for a "did you mean" hint.
    pub fn written_like(&self, name: &str) -> String {
        if self.written.starts_with("Tool::") {
            format!("Tool::{name:?}")
        } else {
            format!("{name:?}")
        }
    }
}

/// Strings a policy compares with `resource.name`, read from its JSON form: `resource.name ==
/// "x"` (either side) and `["x", "y"].contains(resource.name)`.
fn resource_name_literals(v: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    let is_name = |v: &Value| {
        v.get(".").is_some_and(|dot| {
            dot.get("attr").and_then(Value::as_str) == Some("name")
                && dot.pointer("/left/Var").and_then(Value::as_str) == Some("resource")
        })
    };
    let string = |v: &Value| v.get("Value").and_then(Value::as_str).map(str::to_string);
    match v {
        Value::Object(map) => {
            if let Some(eq) = map.get("==")
                && let (Some(l), Some(r)) = (eq.get("left"), eq.get("right"))
            {
                if is_name(l) {
                    out.extend(string(r));
                } else if is_name(r) {
                    out.extend(string(l));
                }
            }
            if let Some(c) = map.get("contains")
                && let (Some(set), Some(r)) = (c.get("left"), c.get("right"))
                && is_name(r)
                && let Some(items) = set.get("Set").and_then(Value::as_array)
            {
                out.extend(items.iter().filter_map(string));
            }
            for child in map.values() {
                resource_name_literals(child, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                resource_name_literals(child, out);
            }
        }
        _ => {}
    }
}
