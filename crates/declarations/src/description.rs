//! The codemode tool's description: the script API in a few lines, then the listed tools grouped
//! by namespace within a shared token budget. The budget takes whole namespaces, so a namespace's
//! heading either comes with all its tools or says that none of them is listed.
//!
//! The text depends only on the set of tools, never on the order they were registered in (all
//! inputs are sorted), and deferred tools never enter it, so it stays byte-identical — and the
//! provider's prompt cache stays warm — while MCP servers connect.

use std::cell::Cell;
use std::collections::BTreeMap;

use codemode_spec::{CodemodeMode, Exposure, NamespaceSpec, ToolSpec};

use crate::identifiers::{IdentifierCollision, collision_note, identifier_collisions, member_key};
use crate::intro::{Intro, Omitted};
use crate::mcp_result::{MCP_RESULT_TYPES, structured_content};
use crate::render::{Listing, RenderOptions, ToolTypes, print_signature, push_comment};
use crate::schema::Ty;
use crate::shared::SharedTypes;
use crate::text::{comment_lines, shorten};
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
    /// Tokens (o200k) for the tool listing: namespace headings and declarations. A namespace that
    /// does not fit is shown by its heading and tool count only, and stays callable.
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

/// How much of each tool the listing prints. The description takes the richest level at which
/// every namespace fits the budget, so a small catalog is shown whole and a larger one loses the
/// least useful text first; `describeTool` always has everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Detail {
    /// A tool's description is cut after whole sentences past this many characters (`…`).
    description_chars: Option<usize>,
    /// The same for a parameter's comment.
    parameter_chars: Option<usize>,
    /// Parameter comments.
    parameter_docs: bool,
    /// Leave out tags a call passes validation without: `@default`, `@minLen 1`.
    lean_tags: bool,
}

const DETAILS: [Detail; 5] = [
    Detail {
        description_chars: None,
        parameter_chars: None,
        parameter_docs: true,
        lean_tags: false,
    },
    // MCP servers write for models that call one tool at a time; what a script needs comes first.
    Detail {
        description_chars: Some(240),
        parameter_chars: Some(120),
        parameter_docs: true,
        lean_tags: false,
    },
    Detail {
        description_chars: Some(160),
        parameter_chars: Some(80),
        parameter_docs: true,
        lean_tags: false,
    },
    Detail {
        description_chars: Some(120),
        parameter_chars: Some(50),
        parameter_docs: true,
        lean_tags: true,
    },
    Detail {
        description_chars: Some(100),
        parameter_chars: None,
        parameter_docs: false,
        lean_tags: true,
    },
];

/// The codemode tool's description.
///
/// Listed: `codemode` tools, and in mode `only` also `direct` ones. In mode `on` direct tools are
/// declared to the model already, so they are only named (each carries [`crate::direct_tool_note`]).
/// `deferred` and `hidden` tools never appear. Tools are grouped by namespace (tools without one
/// first). A namespace is listed whole or not at all: the group without a namespace first, then
/// namespaces from the cheapest, each while it fits `inline_budget_tokens`; the others keep their
/// heading with their tool count, so the model knows to search them. Texts are printed whole when
/// everything fits, else shortened (see [`Detail`]). Object shapes several listed tools share are
/// declared once by name, and an MCP tool's result is the `McpResult` type.
pub fn codemode_description(input: &DescriptionInput) -> String {
    let tools = sorted_unique(input.tools);
    let mut listed: Vec<&ToolSpec> = Vec::new();
    let mut direct: Vec<&ToolSpec> = Vec::new();
    let mut deferred = false;
    let mut mcp = false;
    for tool in tools {
        match (tool.exposure, input.mode) {
            (Exposure::Codemode, _) | (Exposure::Direct, CodemodeMode::Only) => listed.push(tool),
            (Exposure::Direct, CodemodeMode::On) => direct.push(tool),
            (Exposure::Deferred, _) => deferred = true,
            (Exposure::Hidden, _) => continue,
        }
        mcp |= tool
            .output_schema
            .as_ref()
            .is_some_and(|s| structured_content(s).is_some());
    }
    let visible: Vec<ToolSpec> = listed.iter().chain(&direct).map(|t| (*t).clone()).collect();
    let collisions = identifier_collisions(&visible);

    let mut chosen = None;
    for detail in DETAILS {
        let groups = group_by_namespace(&listed, input.namespaces, &collisions, detail);
        let shown = select(&groups, input.inline_budget_tokens);
        let all = shown.iter().all(|s| *s);
        chosen = Some((groups, shown, detail));
        if all {
            break;
        }
    }
    let Some((groups, shown, detail)) = chosen else {
        return String::new();
    };
    let (block, shortened) = listing(&groups, &shown, mcp, detail);

    let direct_names: Vec<String> = direct
        .iter()
        .map(|t| format!("`{}`", call_path(t, &collisions)))
        .collect();
    let intro = Intro {
        tools: !listed.is_empty() || !direct.is_empty() || deferred,
        mcp,
        listed: shown.iter().any(|s| *s),
        omitted: Omitted {
            namespaces: shown.iter().any(|s| !s),
            deferred,
            shortened,
            parameter_docs: !detail.parameter_docs && shown.iter().any(|s| *s),
        },
        globals: &input.globals,
        direct: &direct_names,
    };
    let mut out = intro.render();
    if let Some(block) = block {
        out.push_str("\n\n");
        out.push_str(&block);
    }
    out.push_str(&unavailable_namespaces(input.namespaces));
    out
}

/// Namespaces whose tools are missing or failing now (an MCP server starting or down), with
/// why: outside the budget, since without it the model cannot tell a broken server from a
/// name that does not exist.
const UNAVAILABLE_CHARS: usize = 400;

fn unavailable_namespaces(namespaces: &[NamespaceSpec]) -> String {
    let mut down: Vec<(&str, &str)> = namespaces
        .iter()
        .filter_map(|ns| Some((ns.name.as_str(), ns.unavailable.as_deref()?)))
        .collect();
    if down.is_empty() {
        return String::new();
    }
    down.sort();
    down.dedup_by(|a, b| a.0 == b.0);
    let mut out = String::from("\n\nNot available now (their tools are missing until they are):");
    for (name, why) in down {
        // A server's stderr can be long; the error of a call to it has all of it.
        let why = comment_lines(why).join(" ");
        let why = match why.char_indices().nth(UNAVAILABLE_CHARS) {
            Some((cut, _)) => format!("{}…", why[..cut].trim_end()),
            None => why,
        };
        out.push_str(&format!("\n- {name}: {why}"));
    }
    out
}

/// The TypeScript block: `McpResult` and shared types, then `tools` by namespace. `None` when
/// there is nothing to declare. The flag says whether some text was shortened.
fn listing(groups: &[Group], shown: &[bool], mcp: bool, detail: Detail) -> (Option<String>, bool) {
    if groups.is_empty() && !mcp {
        return (None, false);
    }
    let listed: Vec<&Entry> = groups
        .iter()
        .zip(shown)
        .filter(|(_, s)| **s)
        .flat_map(|(g, _)| &g.entries)
        .collect();
    let trees: Vec<&Ty> = listed.iter().flat_map(|e| e.types.trees()).collect();
    let shared = SharedTypes::find(&trees);
    let listing = Listing {
        shared: Some(&shared),
        doc_chars: detail.parameter_chars,
        shortened: Cell::new(false),
        lean_tags: detail.lean_tags,
    };
    let mut out = String::from("```ts\n");
    if mcp {
        out.push_str(MCP_RESULT_TYPES);
    }
    if !shared.is_empty() {
        out.push_str(&shared.declarations(&listing));
    }
    out.push_str("declare const tools: {\n");
    let mut shortened = false;
    for (position, (group, shown)) in groups.iter().zip(shown).enumerate() {
        let heading = group.heading(!shown);
        // Blank lines separate namespaces, not the block's opening line from the first one.
        out.push_str(if position == 0 {
            heading.trim_start_matches('\n')
        } else {
            &heading
        });
        if !shown {
            continue;
        }
        for entry in &group.entries {
            shortened |= entry.shortened;
            out.push_str(&entry.render(&listing, detail));
        }
    }
    out.push_str("};\n```");
    (Some(out), shortened || listing.shortened.get())
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

/// One listed tool, read once: its comment lines and types.
struct Entry {
    key: String,
    comment: Vec<String>,
    types: ToolTypes,
    /// The description was cut short.
    shortened: bool,
}

impl Entry {
    fn new(tool: &ToolSpec, collisions: &[IdentifierCollision], detail: Detail) -> Entry {
        let short = detail
            .description_chars
            .and_then(|max| shorten(&tool.description, max));
        let (mut comment, shortened) = match short {
            Some(short) => (vec![short], true),
            None => (comment_lines(&tool.description), false),
        };
        if let Some(note) = collision_note(tool, collisions) {
            comment.push(note);
        }
        Entry {
            key: member_key(tool, collisions),
            comment,
            types: ToolTypes::of(tool),
            shortened,
        }
    }

    /// Its description as comments, then its signature.
    fn render(&self, listing: &Listing, detail: Detail) -> String {
        let mut out = String::new();
        push_comment(&mut out, &self.comment, "");
        let opts = RenderOptions {
            docs: detail.parameter_docs,
            ..RenderOptions::default()
        };
        out.push_str(&print_signature(
            &self.key,
            &self.types,
            &opts,
            false,
            listing,
        ));
        out.push('\n');
        out
    }
}

struct Group {
    name: Option<String>,
    description: Vec<String>,
    /// In name order.
    entries: Vec<Entry>,
    /// Tokens of all entries, printed without shared types (an upper bound).
    cost: usize,
}

impl Group {
    /// `// ## name: first description line`, then the rest of the description; a namespace that
    /// is not listed ends its first line with `(N tools, not listed)` and shows nothing else.
    fn heading(&self, omitted: bool) -> String {
        let count = self.entries.len();
        let left_out = match (omitted, count) {
            (false, _) => String::new(),
            (true, 1) => " (1 tool, not listed)".to_string(),
            (true, n) => format!(" ({n} tools, not listed)"),
        };
        match &self.name {
            Some(name) => {
                // A blank line before a namespace with tools; headings alone stay together.
                let gap = if omitted { "" } else { "\n" };
                let mut out = format!("{gap}// ## {}", one_line_name(name));
                let mut lines = self.description.iter();
                if let Some(first) = lines.next() {
                    out.push_str(": ");
                    out.push_str(first);
                }
                out.push_str(&left_out);
                out.push('\n');
                if !omitted {
                    let rest: Vec<String> = lines.cloned().collect();
                    push_comment(&mut out, &rest, "");
                }
                out
            }
            None if omitted => format!("// ({count} tools without a namespace, not listed)\n"),
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
    detail: Detail,
) -> Vec<Group> {
    let mut by_name: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    for tool in listed {
        by_name
            .entry(tool.namespace.clone())
            .or_default()
            .push(Entry::new(tool, collisions, detail));
    }
    let plain = Listing {
        shared: None,
        doc_chars: detail.parameter_chars,
        shortened: Cell::new(false),
        lean_tags: detail.lean_tags,
    };
    by_name
        .into_iter()
        .map(|(name, entries)| {
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
            let cost = entries
                .iter()
                .map(|e| count_tokens(&e.render(&plain, detail), Encoding::O200kBase))
                .sum();
            Group {
                name,
                description,
                entries,
                cost,
            }
        })
        .collect()
}

/// Which groups are listed. Every heading is charged first (in its longer, not-listed form, so
/// the total stays within budget whichever form is printed); then the group without a namespace,
/// then namespaces from the cheapest (ties by name), each if it fits what is left.
fn select(groups: &[Group], budget: usize) -> Vec<bool> {
    let headings: usize = groups
        .iter()
        .map(|g| {
            count_tokens(&g.heading(true), Encoding::O200kBase)
                .max(count_tokens(&g.heading(false), Encoding::O200kBase))
        })
        .sum();
    let mut remaining = budget.saturating_sub(headings);
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&groups[a], &groups[b]);
        b.name
            .is_none()
            .cmp(&a.name.is_none())
            .then(a.cost.cmp(&b.cost))
            .then(a.name.cmp(&b.name))
    });
    let mut shown = vec![false; groups.len()];
    for g in order {
        if groups[g].cost <= remaining {
            remaining -= groups[g].cost;
            shown[g] = true;
        }
    }
    shown
}
