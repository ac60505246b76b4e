//! The codemode tool's description: the script API in a few lines, then the listed tools grouped
//! by namespace within a shared token budget.
//!
//! The text depends only on the set of tools, never on the order they were registered in (all
//! inputs are sorted), and deferred tools never enter it, so it stays byte-identical — and the
//! provider's prompt cache stays warm — while MCP servers connect.

use std::collections::BTreeMap;

use codemode_spec::{CodemodeMode, Exposure, NamespaceSpec, ToolSpec};

use crate::identifiers::{IdentifierCollision, collision_note, identifier_collisions, member_key};
use crate::render::{RenderOptions, push_comment, signature};
use crate::text::comment_lines;
use crate::tokens::{Encoding, count_tokens};

/// Default inline budget, in o200k tokens, for everything below the fixed API text.
pub const DEFAULT_INLINE_BUDGET_TOKENS: usize = 3000;

/// The inline budget for a catalog far larger than [`DEFAULT_INLINE_BUDGET_TOKENS`].
pub const LARGE_CATALOG_BUDGET_TOKENS: usize = 1000;

/// The budget to use when the operator set none. A catalog that fits in three default budgets
/// gets [`DEFAULT_INLINE_BUDGET_TOKENS`]; a larger one gets [`LARGE_CATALOG_BUDGET_TOKENS`]:
/// once most tools cannot be listed anyway, the model finds them with `searchTools`, and every
/// request is cheaper for a smaller listing.
pub fn default_inline_budget(input: &DescriptionInput) -> usize {
    let unbudgeted = DescriptionInput {
        inline_budget_tokens: usize::MAX,
        globals: input.globals.clone(),
        ..*input
    };
    let full = crate::count_tokens(
        &codemode_description(&unbudgeted),
        crate::Encoding::O200kBase,
    );
    if full > 3 * DEFAULT_INLINE_BUDGET_TOKENS {
        LARGE_CATALOG_BUDGET_TOKENS
    } else {
        DEFAULT_INLINE_BUDGET_TOKENS
    }
}

/// Optional script globals that change what the description says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Globals {
    /// `models.*` (classifiers, image generation) is available to scripts.
    pub models: bool,
    /// Where the model can read the `models` API (a file path or URL). Without it the description
    /// names the main calls instead.
    pub models_doc: Option<String>,
}

/// Everything the codemode description is built from.
#[derive(Debug, Clone)]
pub struct DescriptionInput<'a> {
    /// The callable tools (the caller has already removed tools nobody may call).
    pub tools: &'a [ToolSpec],
    /// Descriptions of the namespaces the tools belong to.
    pub namespaces: &'a [NamespaceSpec],
    pub mode: CodemodeMode,
    pub globals: Globals,
    /// Tokens (o200k) for the tool listing: namespace headings and declarations. What does not fit
    /// is counted per namespace as not listed and stays callable.
    pub inline_budget_tokens: usize,
}

impl<'a> DescriptionInput<'a> {
    /// Mode `on`, no optional globals, the default budget.
    pub fn new(tools: &'a [ToolSpec], namespaces: &'a [NamespaceSpec]) -> Self {
        DescriptionInput {
            tools,
            namespaces,
            mode: CodemodeMode::On,
            globals: Globals::default(),
            inline_budget_tokens: DEFAULT_INLINE_BUDGET_TOKENS,
        }
    }
}

const INTRO: &str = "Write the body of an async JavaScript function (plain source; no JSON wrapper, no code fence). It runs in QuickJS with no Node APIs, files, network or timers; top-level `await` and `return` work.
- `await tools.<name>(args)` gives the declared result; a failure throws an Error, except that a tool declared to return an object returns it on failure too (read its fields). Calls still running when the script ends are cancelled.
- Show results with `text(v)`, `image(dataUrlOrImageBlock)`, `console.log(...)` or `return v`; `exit()` ends early. Several texts appear under `==> text N/M <==` headers; console lines come last, in `<console_output>`.
- `store(key, value)` / `load(key)` keep JSON between runs.
- Tools not listed here: `ALL_TOOLS`, `await searchTools(query, {limit?, namespace?})`, `await describeTool(name)`, `await describeNamespace(name)`.";

const OPTIONS_LINE: &str =
    "- Optional first line: `// @options: {\"max_output_tokens\": 10000, \"timeout_ms\": 60000}`";

/// The codemode tool's description.
///
/// Listed: `codemode` tools, and in mode `only` also `direct` ones. In mode `on` direct tools are
/// declared to the model already, so they are only named (each carries [`crate::direct_tool_note`]).
/// `deferred` and `hidden` tools never appear. Tools are grouped by namespace (tools without one
/// first), and the groups share `inline_budget_tokens` round-robin: each round every group lists
/// its cheapest remaining tool if it fits, so every namespace is represented before any is
/// complete. Left-out tools are counted under their namespace heading.
pub fn codemode_description(input: &DescriptionInput) -> String {
    let tools = sorted_unique(input.tools);
    let mut listed: Vec<&ToolSpec> = Vec::new();
    let mut direct: Vec<&ToolSpec> = Vec::new();
    for tool in tools {
        match (tool.exposure, input.mode) {
            (Exposure::Codemode, _) | (Exposure::Direct, CodemodeMode::Only) => listed.push(tool),
            (Exposure::Direct, CodemodeMode::On) => direct.push(tool),
            (Exposure::Deferred | Exposure::Hidden, _) => {}
        }
    }
    let visible: Vec<ToolSpec> = listed.iter().chain(&direct).map(|t| (*t).clone()).collect();
    let collisions = identifier_collisions(&visible);

    let mut out = String::from(INTRO);
    if input.globals.models {
        out.push('\n');
        match &input.globals.models_doc {
            Some(doc) => out.push_str(&format!(
                "- `models`: classifiers and image generation; read {doc} first."
            )),
            None => out.push_str(
                "- `models`: classifiers and image generation: `models.getAvailableOfType(type)`, `models.classify(model, context)`, `models.generateImages(model, context)`.",
            ),
        }
    }
    out.push('\n');
    out.push_str(OPTIONS_LINE);

    if !direct.is_empty() {
        let names: Vec<String> = direct
            .iter()
            .map(|t| format!("`{}`", call_path(t, &collisions)))
            .collect();
        out.push_str(&format!(
            "\n\nYour declared tools are callable here too, with the same arguments: {}.",
            names.join(", ")
        ));
    }
    if listed.is_empty() {
        return out;
    }

    let groups = group_by_namespace(&listed, input.namespaces, &collisions);
    let shown = select(&groups, input.inline_budget_tokens);

    out.push_str("\n\n```ts\ndeclare const tools: {\n");
    for (position, (group, shown_count)) in groups.iter().zip(&shown).enumerate() {
        let omitted = group.entries.len() - shown_count;
        let heading = group.heading(omitted);
        // Blank lines separate namespaces, not the block's opening line from the first one.
        out.push_str(if position == 0 {
            heading.trim_start_matches('\n')
        } else {
            &heading
        });
        let mut visible: Vec<&Entry> = group.entries[..*shown_count].iter().collect();
        visible.sort_by_key(|a| a.order);
        for entry in visible {
            out.push_str(&entry.section);
        }
    }
    out.push_str("};\n```");
    out
}

/// How a script calls a tool: `tools.name`, or `tools["raw name"]` when the identifier is shared.
fn call_path(tool: &ToolSpec, collisions: &[IdentifierCollision]) -> String {
    let key = member_key(tool, collisions);
    if key.starts_with('"') {
        format!("tools[{key}]")
    } else {
        format!("tools.{key}")
    }
}

/// Tools sorted by raw name (ties broken by their full JSON, so any registration order gives the
/// same result), one per raw name.
pub(crate) fn sorted_unique(tools: &[ToolSpec]) -> Vec<&ToolSpec> {
    let mut sorted: Vec<&ToolSpec> = tools.iter().collect();
    sorted.sort_by(|a, b| {
        a.name.cmp(&b.name).then_with(|| {
            let a = serde_json::to_string(a).unwrap_or_default();
            let b = serde_json::to_string(b).unwrap_or_default();
            a.cmp(&b)
        })
    });
    sorted.dedup_by(|a, b| a.name == b.name);
    sorted
}

struct Entry {
    /// Position in name order, for printing.
    order: usize,
    section: String,
    cost: usize,
}

struct Group {
    name: Option<String>,
    description: Vec<String>,
    /// Sorted by cost (then name), the order the budget takes them in.
    entries: Vec<Entry>,
}

impl Group {
    /// `// ## name: first description line (N not listed)`, then the rest of the description.
    /// One line per namespace keeps 25 namespaces cheap when most of their tools are left out.
    fn heading(&self, omitted: usize) -> String {
        let left_out = match omitted {
            0 => String::new(),
            n => format!(" ({n} not listed)"),
        };
        match &self.name {
            Some(name) => {
                let mut out = format!("\n// ## {}", one_line_name(name));
                let mut lines = self.description.iter();
                if let Some(first) = lines.next() {
                    out.push_str(": ");
                    out.push_str(first);
                }
                out.push_str(&left_out);
                out.push('\n');
                let rest: Vec<String> = lines.cloned().collect();
                push_comment(&mut out, &rest, "");
                out
            }
            None if omitted > 0 => format!("// ({omitted} tools without a namespace not listed)\n"),
            None => String::new(),
        }
    }
}

fn one_line_name(name: &str) -> String {
    comment_lines(name).join(" ")
}

fn group_by_namespace(
    listed: &[&ToolSpec],
    namespaces: &[NamespaceSpec],
    collisions: &[IdentifierCollision],
) -> Vec<Group> {
    let mut by_name: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    for (order, tool) in listed.iter().enumerate() {
        let section = tool_section(tool, collisions);
        let cost = count_tokens(&section, Encoding::O200kBase);
        by_name
            .entry(tool.namespace.clone())
            .or_default()
            .push(Entry {
                order,
                section,
                cost,
            });
    }
    by_name
        .into_iter()
        .map(|(name, mut entries)| {
            entries.sort_by(|a, b| a.cost.cmp(&b.cost).then(a.order.cmp(&b.order)));
            // With duplicate specs for one name, the smallest wins, whatever their order.
            let description = name
                .as_ref()
                .and_then(|n| {
                    namespaces.iter().filter(|ns| &ns.name == n).min_by(|a, b| {
                        (&a.description, &a.instructions).cmp(&(&b.description, &b.instructions))
                    })
                })
                .and_then(|ns| ns.description.as_deref())
                .map(comment_lines)
                .unwrap_or_default();
            Group {
                name,
                description,
                entries,
            }
        })
        .collect()
}

/// A listed tool: its description as comments, a note if its identifier is shared, its signature.
fn tool_section(tool: &ToolSpec, collisions: &[IdentifierCollision]) -> String {
    let mut lines = comment_lines(&tool.description);
    if let Some(note) = collision_note(tool, collisions) {
        lines.push(note);
    }
    let mut out = String::new();
    push_comment(&mut out, &lines, "");
    let key = member_key(tool, collisions);
    out.push_str(&signature(tool, &key, &RenderOptions::default(), false));
    out.push('\n');
    out
}

/// How many entries of each group fit the budget (entries are taken from the front: cheapest
/// first). Headings are charged first since they are always shown; when they alone exceed the
/// budget, only headings are shown.
fn select(groups: &[Group], budget: usize) -> Vec<usize> {
    // Charged with the longer "(N tools not listed)" form, so the total stays within budget
    // whichever form is printed.
    let headings: usize = groups
        .iter()
        .map(|g| count_tokens(&g.heading(g.entries.len()), Encoding::O200kBase))
        .sum();
    let mut remaining = budget.saturating_sub(headings);
    let mut shown = vec![0usize; groups.len()];
    let mut active: Vec<usize> = (0..groups.len()).collect();
    while !active.is_empty() {
        active.retain(|&g| {
            let Some(next) = groups[g].entries.get(shown[g]) else {
                return false;
            };
            if next.cost > remaining {
                return false;
            }
            remaining -= next.cost;
            shown[g] += 1;
            shown[g] < groups[g].entries.len()
        });
    }
    shown
}
