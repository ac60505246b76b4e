//! What a script sees of the registry, built once for every script started while the registry
//! stays the same.
//!
//! A server may list thousands of tools with large schemas (red team finding F6): rendering
//! every tool's sample for `ALL_TOOLS` and building the `searchTools` index for each script
//! made every script pay seconds of host time and hundreds of megabytes. The specs share their
//! schemas with the registry (`ToolSpec` holds them as shared text), `ALL_TOOLS` carries at
//! most [`ALL_TOOLS_MAX_BYTES`] of descriptions, and the view is dropped as soon as the
//! registry changes and no running script holds it.

use std::sync::{Arc, Mutex, OnceLock};

use codemode_declarations::ToolIndex;
use codemode_sandbox::ToolEntry;
use codemode_spec::{CallKind, NamespaceSpec, ToolSpec};

use crate::Codemode;

pub(crate) struct ScriptView {
    /// The registry's generation this was built from.
    generation: u64,
    /// Everything a script may call: tools, model operations and gated globals.
    pub callable: Vec<ToolSpec>,
    /// The tools among them (`tools.<name>`).
    pub tools: Vec<ToolSpec>,
    /// The tools as `ALL_TOOLS` lists them, with their samples.
    pub entries: Vec<ToolEntry>,
    pub namespaces: Vec<NamespaceSpec>,
    /// The `searchTools` index, built by the first script that searches.
    pub index: OnceLock<ToolIndex>,
}

impl ScriptView {
    /// The search index over [`ScriptView::tools`], built on first use.
    pub(crate) fn index(&self) -> &ToolIndex {
        self.index
            .get_or_init(|| ToolIndex::new(&self.tools, &self.namespaces))
    }
}

/// The most bytes of tool descriptions `ALL_TOOLS` carries into each script: about 500,000
/// tokens, far past what a model reads at once, and ten times the samples of 543 tools (the
/// test catalog of 500 and three real servers: 193 KB).
const ALL_TOOLS_MAX_BYTES: usize = 2 * 1024 * 1024;

/// The view last built, kept while the registry stays the same.
#[derive(Default)]
pub(crate) struct ViewCache(Mutex<Option<Arc<ScriptView>>>);

impl Codemode {
    /// What a script started now sees: the view last built when the registry has not changed
    /// since, else a new one.
    pub(crate) fn script_view(&self) -> Arc<ScriptView> {
        let registry = self.gate().registry();
        // Read before the registry's contents: a change in between makes the view built here
        // stale at once, never a stale view look current.
        let generation = registry.generation();
        let mut slot = self.inner.views.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(view) = slot.as_ref()
            && view.generation == generation
        {
            return view.clone();
        }
        let callable = registry.script_callable();
        let tools: Vec<ToolSpec> = callable
            .iter()
            .filter(|s| s.kind == CallKind::Tool)
            .cloned()
            .collect();
        let descriptions =
            codemode_declarations::all_tools_descriptions(&tools, ALL_TOOLS_MAX_BYTES);
        let entries = tools
            .iter()
            .zip(descriptions)
            .map(|(s, description)| ToolEntry {
                name: s.name.clone(),
                description,
            })
            .collect();
        let view = Arc::new(ScriptView {
            generation,
            callable,
            tools,
            entries,
            namespaces: registry.namespaces(),
            index: OnceLock::new(),
        });
        *slot = Some(view.clone());
        view
    }
}
