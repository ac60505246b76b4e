//! The set of tools, their exposure and active state, read again at every call.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use codemode_spec::{
    CallKind, CodemodeMode, Exposure, NamespaceSpec, Tool, ToolSpec, to_identifier,
};

use crate::error::RegistryError;

/// Name of the codemode tool itself: the one tool declared to the model in `only` mode.
pub const CODEMODE_TOOL: &str = "codemode";

/// One registered tool with the state the registry keeps about it.
struct Entry {
    tool: Arc<dyn Tool>,
    exposure: Exposure,
    active: bool,
    /// Compiled once, at the tool's first call; an invalid schema refuses calls instead of
    /// registration, so one bad MCP tool does not take its server's other tools down.
    validator: Arc<LazyValidator>,
}

/// A tool's input schema, compiled into a validator when a call first needs it. A compiled
/// validator takes many times its schema's memory, and a server may list thousands of tools
/// that are never called: compiling them all at registration made a large listing cost the
/// host hundreds of megabytes.
pub(crate) struct LazyValidator {
    schema: codemode_spec::Schema,
    compiled: std::sync::OnceLock<Result<jsonschema::Validator, String>>,
}

impl LazyValidator {
    fn new(schema: codemode_spec::Schema) -> LazyValidator {
        LazyValidator {
            schema,
            compiled: std::sync::OnceLock::new(),
        }
    }

    /// The validator, compiled on first use (outside the registry's lock: compiling a schema
    /// can take a while), or why the schema cannot be checked against.
    pub(crate) fn get(&self) -> &Result<jsonschema::Validator, String> {
        self.compiled.get_or_init(|| {
            let schema = &self.schema.value();
            let limit = crate::schema_size::MAX_EXPANDED_NODES;
            if crate::schema_size::expanded_nodes(schema, limit) > limit {
                Err(format!(
                    "the tool's input schema expands past {limit} nodes through its `$ref`s, too many to check a call against; the tool's server must simplify it"
                ))
            } else {
                crate::unique_items::validator_options()
                    .build(schema)
                    .map_err(|e| format!("the tool's input schema is invalid: {e}"))
            }
        })
    }

    /// Whether the validator was compiled yet.
    #[cfg(test)]
    pub(crate) fn is_compiled(&self) -> bool {
        self.compiled.get().is_some()
    }
}

impl Entry {
    fn spec(&self) -> ToolSpec {
        let mut spec = self.tool.spec().clone();
        spec.exposure = self.exposure;
        spec
    }

    fn script_callable(&self) -> bool {
        // A script cannot start another script.
        if self.tool.spec().name == CODEMODE_TOOL {
            return false;
        }
        match self.exposure {
            Exposure::Codemode | Exposure::Deferred => true,
            Exposure::Direct => self.active,
            Exposure::Hidden => false,
        }
    }
}

#[derive(Default)]
struct Inner {
    tools: BTreeMap<String, Entry>,
    namespaces: BTreeMap<String, NamespaceSpec>,
    /// Identifier → raw name of every visible tool, so that registering or resolving one tool
    /// does not walk all the others (a server with 20 000 tools made that quadratic).
    identifiers: HashMap<String, String>,
    /// Bumped by every change ([`Registry::generation`]).
    generation: u64,
}

impl Inner {
    fn index(&mut self, name: &str) {
        self.identifiers
            .insert(to_identifier(name), name.to_string());
    }

    fn unindex(&mut self, name: &str) {
        let identifier = to_identifier(name);
        if self.identifiers.get(&identifier).map(String::as_str) == Some(name) {
            self.identifiers.remove(&identifier);
        }
    }
}

/// The tools behind the gate.
///
/// Shared by the gate and whoever manages tools (MCP connections, settings). Changes are visible
/// to calls already in flight at their next resolve, because the gate resolves every call again
/// against the registry instead of trusting a snapshot taken when a script started.
#[derive(Default, Clone)]
pub struct Registry {
    inner: Arc<RwLock<Inner>>,
}

/// What resolve found: the tool, its effective spec and its validator.
pub(crate) struct Resolved {
    pub tool: Arc<dyn Tool>,
    pub spec: ToolSpec,
    pub active: bool,
    pub validator: Arc<LazyValidator>,
}

/// The outcome of looking a name up, before the caller's rights are considered.
pub(crate) enum Lookup {
    Found(Box<Resolved>),
    Missing { suggestions: Vec<String> },
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // A poisoned lock means a panic elsewhere; the map itself is still consistent.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.generation += 1;
        inner
    }

    /// A number that changes whenever the registry may have (a tool, an exposure, an active
    /// state or a namespace). What is built from the registry can be kept while it stays the
    /// same; read it before reading what it versions.
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Adds a tool with the exposure its spec declares. Direct tools start active.
    pub fn register(&self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let exposure = tool.spec().exposure;
        self.insert(tool, exposure, false)
    }

    /// Adds a tool, or swaps in a new version of one of the same name, with `exposure` in
    /// place of the one its spec declares, in one step.
    ///
    /// For tools that change while scripts run (an MCP server's list changed): there is no
    /// moment when the tool is missing, or callable with the exposure it declared before the
    /// settings' rules narrowed it, or judged by the old spec after the swap.
    pub fn install(&self, tool: Arc<dyn Tool>, exposure: Exposure) -> Result<(), RegistryError> {
        self.insert(tool, exposure, true)
    }

    fn insert(
        &self,
        tool: Arc<dyn Tool>,
        exposure: Exposure,
        replace: bool,
    ) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        let validator = Arc::new(LazyValidator::new(tool.spec().input_schema.clone()));
        let mut inner = self.write();
        let old = inner.tools.get(&name).map(|e| (e.exposure, e.active));
        if old.is_some() && !replace {
            return Err(RegistryError::Duplicate(name));
        }
        if exposure != Exposure::Hidden {
            check_identifier(&inner, &name, old.map(|_| name.as_str()))?;
        }
        let active = match old {
            Some((was, active)) if was == exposure => active,
            _ => exposure == Exposure::Direct,
        };
        if exposure == Exposure::Hidden {
            inner.unindex(&name);
        } else {
            inner.index(&name);
        }
        inner.tools.insert(
            name,
            Entry {
                tool,
                exposure,
                active,
                validator,
            },
        );
        Ok(())
    }

    /// Withdraws a tool. Calls that already passed resolve finish; later calls find nothing.
    pub fn remove(&self, name: &str) {
        let mut inner = self.write();
        if inner.tools.remove(name).is_some() {
            inner.unindex(name);
        }
    }

    /// Changes who may see and call a tool.
    pub fn set_exposure(&self, name: &str, exposure: Exposure) -> Result<(), RegistryError> {
        let mut inner = self.write();
        if !inner.tools.contains_key(name) {
            return Err(RegistryError::Unknown(name.to_string()));
        }
        if exposure != Exposure::Hidden {
            check_identifier(&inner, name, Some(name))?;
        }
        if let Some(entry) = inner.tools.get_mut(name) {
            if entry.exposure != Exposure::Direct && exposure == Exposure::Direct {
                entry.active = true;
            }
            entry.exposure = exposure;
        }
        if exposure == Exposure::Hidden {
            inner.unindex(name);
        } else {
            inner.index(name);
        }
        Ok(())
    }

    /// Activates or deactivates a direct tool (declared to the model, callable from scripts).
    pub fn set_active(&self, name: &str, active: bool) -> Result<(), RegistryError> {
        let mut inner = self.write();
        let entry = inner
            .tools
            .get_mut(name)
            .ok_or_else(|| RegistryError::Unknown(name.to_string()))?;
        if entry.exposure != Exposure::Direct {
            return Err(RegistryError::NotDirect {
                name: name.to_string(),
                exposure: entry.exposure.as_str().to_string(),
            });
        }
        entry.active = active;
        Ok(())
    }

    pub fn add_namespace(&self, ns: NamespaceSpec) {
        self.write().namespaces.insert(ns.name.clone(), ns);
    }

    pub fn namespaces(&self) -> Vec<NamespaceSpec> {
        self.read().namespaces.values().cloned().collect()
    }

    /// Every registered tool with its effective exposure, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.read().tools.values().map(Entry::spec).collect()
    }

    /// Every tool's spec with the exposure it declared itself, before any change. Settings are
    /// applied from these, so applying them twice gives the same result.
    pub fn declared_specs(&self) -> Vec<ToolSpec> {
        self.read()
            .tools
            .values()
            .map(|e| e.tool.spec().clone())
            .collect()
    }

    /// What a script may call now: codemode and deferred tools, and direct tools while active.
    pub fn script_callable(&self) -> Vec<ToolSpec> {
        self.read()
            .tools
            .values()
            .filter(|e| e.script_callable())
            .map(Entry::spec)
            .collect()
    }

    /// What the model sees as its own tools: active direct tools in `on` mode; in `only` mode
    /// nothing but the codemode tool.
    pub fn model_declared(&self, mode: CodemodeMode) -> Vec<ToolSpec> {
        self.read()
            .tools
            .iter()
            .filter(|(name, e)| match mode {
                CodemodeMode::On => {
                    (e.exposure == Exposure::Direct && e.active) || name.as_str() == CODEMODE_TOOL
                }
                CodemodeMode::Only => name.as_str() == CODEMODE_TOOL,
            })
            .map(|(_, e)| e.spec())
            .collect()
    }

    /// The kind of the tool `name` finds, as [`Registry::lookup`] would, without looking for
    /// close names when there is none.
    pub(crate) fn kind_of(&self, name: &str) -> Option<CallKind> {
        let inner = self.read();
        let entry = inner.tools.get(name).or_else(|| {
            let raw = inner.identifiers.get(name)?;
            inner.tools.get(raw)
        });
        entry.map(|e| e.tool.spec().kind)
    }

    /// Finds a tool by its raw name, or by the identifier scripts write for it.
    pub(crate) fn lookup(&self, name: &str) -> Lookup {
        let inner = self.read();
        let entry = inner.tools.get(name).or_else(|| {
            let raw = inner.identifiers.get(name)?;
            inner
                .tools
                .get(raw)
                .filter(|e| e.exposure != Exposure::Hidden)
        });
        match entry {
            Some(e) => Lookup::Found(Box::new(Resolved {
                tool: e.tool.clone(),
                spec: e.spec(),
                active: e.active,
                validator: e.validator.clone(),
            })),
            None => {
                let candidates: Vec<&str> = inner
                    .tools
                    .iter()
                    .filter(|(_, e)| e.exposure != Exposure::Hidden)
                    .map(|(n, _)| n.as_str())
                    .collect();
                Lookup::Missing {
                    suggestions: crate::suggest::close_names(name, &candidates),
                }
            }
        }
    }
}

impl Registry {
    /// The effective exposure of the tool registered under exactly `name`, if one is.
    pub fn exposure(&self, name: &str) -> Option<Exposure> {
        self.read().tools.get(name).map(|e| e.exposure)
    }

    /// Whether a tool of exactly this raw name is registered (any exposure); if not, up to three
    /// registered names close to it.
    pub fn closest_if_unknown(&self, name: &str) -> Option<Vec<String>> {
        let inner = self.read();
        if inner.tools.contains_key(name) {
            return None;
        }
        let candidates: Vec<&str> = inner.tools.keys().map(String::as_str).collect();
        Some(crate::suggest::close_names(name, &candidates))
    }
}

/// Refuses a second visible tool that scripts would reach under the same identifier.
fn check_identifier(inner: &Inner, name: &str, skip: Option<&str>) -> Result<(), RegistryError> {
    let identifier = to_identifier(name);
    match inner.identifiers.get(&identifier) {
        Some(other) if Some(other.as_str()) != skip => Err(RegistryError::IdentifierCollision {
            existing: other.clone(),
            new: name.to_string(),
            identifier,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_spec::{PreparedCall, ToolError};
    use serde_json::{Value, json};

    struct Listed(ToolSpec);

    impl Tool for Listed {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
            unreachable!("never called")
        }
    }

    /// A server may list 5,000 tools with large schemas (red team finding F6): every list the
    /// registry hands out (to scripts, the search index, the policy schema) shares each tool's
    /// schemas instead of copying them, and no validator is compiled before a call needs it.
    #[test]
    fn thousands_of_tools_share_their_schemas_and_compile_nothing_until_called() {
        let registry = Registry::new();
        let mut tools = Vec::new();
        for i in 0..5_000 {
            let mut spec = ToolSpec::new(
                format!("mcp__big__tool_{i}"),
                "a tool",
                json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
            );
            spec.namespace = Some("mcp__big".into());
            spec.output_schema = Some(codemode_spec::Schema::from(json!({"type": "object"})));
            let tool: Arc<dyn Tool> = Arc::new(Listed(spec));
            registry.register(tool.clone()).unwrap();
            tools.push(tool);
        }
        for list in [
            registry.specs(),
            registry.declared_specs(),
            registry.script_callable(),
        ] {
            assert_eq!(list.len(), 5_000);
            for spec in &list {
                let i: usize = spec.name.rsplit('_').next().unwrap().parse().unwrap();
                let own = tools[i].spec();
                assert_eq!(spec.name, own.name);
                assert!(spec.input_schema.shares(&own.input_schema));
                let (out, own_out) = (spec.output_schema.as_ref(), own.output_schema.as_ref());
                assert!(out.unwrap().shares(own_out.unwrap()));
            }
        }
        let inner = registry.read();
        assert!(inner.tools.values().all(|e| !e.validator.is_compiled()));
        drop(inner);
        let Lookup::Found(resolved) = registry.lookup("mcp__big__tool_7") else {
            panic!("registered");
        };
        assert!(
            resolved
                .spec
                .input_schema
                .shares(&tools[7].spec().input_schema)
        );
        let validator = resolved.validator.get().as_ref().expect("a valid schema");
        assert!(!validator.is_valid(&json!({})));
        assert!(validator.is_valid(&json!({"id": "x"})));
        let compiled = registry
            .read()
            .tools
            .values()
            .filter(|e| e.validator.is_compiled())
            .count();
        assert_eq!(compiled, 1, "only the tool looked up for a call");
    }
}
