//! The codemode tool's description: the script API in a few lines, then the listed tools grouped
//! by namespace within a shared token budget. The budget takes whole namespaces, so a namespace's
//! heading either comes with all its tools or says that none of them is listed.
//!
//! The text depends only on the set of tools, never on the order they were registered in (all
//! inputs are sorted), and deferred tools never enter it, so it stays byte-identical — and the
//! provider's prompt cache stays warm — while MCP servers connect.

use std::cell::{Cell, OnceCell};
use std::collections::{BTreeMap, HashMap};

use codemode_spec::{CodemodeMode, Exposure, NamespaceSpec, ToolSpec};

use crate::identifiers::{IdentifierCollision, collision_note, identifier_collisions, member_key};
use crate::intro::{Intro, Omitted};
use crate::mcp_result::{MCP_RESULT_TYPES, structured_content};
use crate::render::{
    Listing, RenderOptions, ToolTypes, print_output, print_signature, push_comment,
};
use crate::schema::Ty;
use crate::shared::SharedTypes;
use crate::text::{comment_lines, cut_to_tokens, foreign_comment_lines, json_string, shorten};
use crate::tokens::{Encoding, count_tokens};

/// Default inline budget, in o200k tokens, for everything below the fixed API text.
pub const DEFAULT_INLINE_BUDGET_TOKENS: usize = 2400;

/// The inline budget for a catalog far larger than [`DEFAULT_INLINE_BUDGET_TOKENS`].
pub const LARGE_CATALOG_BUDGET_TOKENS: usize = 1000;

/// The budget to use when the operator set none. A catalog whose whole description fits in
/// three default budgets gets [`DEFAULT_INLINE_BUDGET_TOKENS`]; a larger one (or one with a
/// namespace that could not be listed within them even with its texts shortened) gets
/// [`LARGE_CATALOG_BUDGET_TOKENS`]:
/// once most tools cannot be listed anyway, the model finds them with `searchTools`, and every
/// request is cheaper for a smaller listing.
pub fn default_inline_budget(input: &DescriptionInput) -> usize {
    let limit = 3 * DEFAULT_INLINE_BUDGET_TOKENS;
    // A namespace that cannot be listed within the limit even at the leanest detail makes the
    // catalog large without rendering it whole, which took seconds for thousands of tools.
    let bounded = DescriptionInput {
        inline_budget_tokens: limit,
        globals: input.globals.clone(),
        ..*input
    };
    if describe(&bounded, true).is_none() {
        return LARGE_CATALOG_BUDGET_TOKENS;
    }
    let unbudgeted = DescriptionInput {
        inline_budget_tokens: usize::MAX,
        globals: input.globals.clone(),
        ..*input
    };
    let full = codemode_description(&unbudgeted);
    // Counting a huge description is slow; its size alone can show it is over.
    if full.len() / MAX_CHARS_PER_TOKEN > limit
        || crate::count_tokens(&full, crate::Encoding::O200kBase) > limit
    {
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
    /// Scripts run as cells: a long run yields and is resumed with the `wait` tool.
    pub cells: bool,
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
    describe(input, false).unwrap_or_default()
}

/// [`codemode_description`]; `None`, as soon as it is known, when `only_if_all_listed` and some
/// namespace cannot be listed.
fn describe(input: &DescriptionInput, only_if_all_listed: bool) -> Option<String> {
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
            .is_some_and(|s| structured_content(&s.value()).is_some());
    }
    let visible: Vec<ToolSpec> = listed.iter().chain(&direct).map(|t| (*t).clone()).collect();
    let collisions = identifier_collisions(&visible);

    // Each tool's schemas are read at most once for every level of detail tried, and only for
    // tools printed: a namespace too large for the budget never reads its tools' schemas.
    let types: Vec<OnceCell<ToolTypes>> = listed.iter().map(|_| OnceCell::new()).collect();
    let headings = heading_descriptions(&listed, input.namespaces, input.inline_budget_tokens);
    let try_detail = |detail: Detail| {
        let groups = group_by_namespace(
            &listed,
            &types,
            &headings,
            &collisions,
            detail,
            input.inline_budget_tokens,
        );
        let shown = select(&groups, input.inline_budget_tokens);
        (groups, shown, detail)
    };
    // When not every namespace fits even at the leanest level, that level is the answer; only
    // otherwise are the richer ones tried, richest first.
    let (leanest, rest) = DETAILS.split_last().expect("at least one level of detail");
    let lean = try_detail(*leanest);
    if only_if_all_listed && !lean.1.iter().all(|s| *s) {
        return None;
    }
    let (groups, shown, detail) = if lean.1.iter().all(|s| *s) {
        rest.iter()
            .map(|d| try_detail(*d))
            .find(|(_, shown, _)| shown.iter().all(|s| *s))
            .unwrap_or(lean)
    } else {
        lean
    };
    let (block, shortened) = listing(&groups, &shown, mcp, detail);

    let direct_names: Vec<String> = direct
        .iter()
        .map(|t| format!("`{}`", call_path(t, &collisions)))
        .collect();
    let prefixed = groups
        .iter()
        .zip(&shown)
        .find(|(g, s)| **s && g.prefix.is_some())
        .and_then(|(g, _)| g.entries.first())
        .map(|e| e.key.as_str());
    let intro = Intro {
        prefixed,
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
    Some(out)
}

/// Namespaces whose tools are missing or failing now (an MCP server starting or down), with
/// why: outside the budget, since without it the model cannot tell a broken server from a
/// name that does not exist.
const UNAVAILABLE_CHARS: usize = 400;
const UNAVAILABLE_TOKENS: usize = 80;

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
        // And in tokens: 400 characters of a dense script are over a thousand.
        let why = cut_to_tokens(&why, UNAVAILABLE_TOKENS).unwrap_or(why);
        out.push_str(&format!("\n- {name}: {why}"));
    }
    out
}

/// The TypeScript block: `McpResult` and shared types, then `tools` by namespace. `None` when
/// there is nothing to declare. The flag says whether some text was shortened.
fn listing(
    groups: &[Group<'_>],
    shown: &[bool],
    mcp: bool,
    detail: Detail,
) -> (Option<String>, bool) {
    if groups.is_empty() && !mcp {
        return (None, false);
    }
    let listed: Vec<&Entry> = groups
        .iter()
        .zip(shown)
        .filter(|(_, s)| **s)
        .flat_map(|(g, _)| &g.entries)
        .collect();
    let trees: Vec<&Ty> = listed.iter().flat_map(|e| e.types().trees()).collect();
    let shared = SharedTypes::find(&trees);
    let mut listing = Listing {
        shared: Some(&shared),
        doc_chars: detail.parameter_chars,
        shortened: Cell::new(false),
        lean_tags: detail.lean_tags,
        awaited: true,
        result_names: None,
    };
    let aliases = result_aliases(groups, shown, &shared, &listing);
    let result_names: HashMap<String, String> = aliases
        .iter()
        .map(|(name, ty)| (ty.clone(), name.clone()))
        .collect();
    let mut out = String::from("```ts\n");
    if mcp {
        out.push_str(MCP_RESULT_TYPES);
    }
    if !shared.is_empty() {
        out.push_str(&shared.declarations(&listing));
    }
    for (name, ty) in &aliases {
        out.push_str(&format!("type {name} = {ty};\n"));
    }
    listing.result_names = Some(&result_names);
    if groups
        .iter()
        .zip(shown)
        .any(|(g, s)| *s && g.prefix.is_some())
    {
        out.push_str(NS_TYPE);
    }
    // The tools without a namespace, then each namespace as `& Ns<"prefix", { … }>`: a
    // namespace's tools share a long prefix that is printed once.
    out.push_str("declare const tools: {\n");
    let mut shortened = false;
    let mut closed = false;
    for (group, shown) in groups.iter().zip(shown) {
        if group.name.is_some() && !closed {
            out.push_str("}\n");
            closed = true;
        }
        out.push_str(&group.heading(!shown));
        shortened |= group.description_shortened;
        if !shown {
            continue;
        }
        if group.name.is_some() {
            match &group.prefix {
                Some(prefix) => out.push_str(&format!("& Ns<{}, {{\n", json_string(prefix))),
                None => out.push_str("& {\n"),
            }
        }
        for entry in &group.entries {
            shortened |= entry.comment().1;
            out.push_str(&entry.render(&listing, detail, group.prefix.as_deref()));
        }
        if group.name.is_some() {
            out.push_str(if group.prefix.is_some() {
                "}>\n"
            } else {
                "}\n"
            });
        }
    }
    if !closed {
        out.push_str("}\n");
    }
    out.push_str("```");
    (Some(out), shortened || listing.shortened.get())
}

/// The result type that most (and at least [`MIN_ALIAS_USES`]) tools of one listed namespace share, long
/// enough to be worth a name: `(FilesystemResult, "McpResult<{ content: string }>")`, named
/// after the namespace's last part. Sorted by name; a type is named once.
fn result_aliases(
    groups: &[Group<'_>],
    shown: &[bool],
    shared: &SharedTypes,
    listing: &Listing,
) -> Vec<(String, String)> {
    let opts = RenderOptions::default();
    let mut taken: Vec<String> = shared.names().map(str::to_string).collect();
    taken.extend(RESERVED_NAMES.iter().map(|s| s.to_string()));
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    let mut seen_types: Vec<String> = Vec::new();
    for (group, _) in groups
        .iter()
        .zip(shown)
        .filter(|(g, s)| **s && g.name.is_some())
    {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for entry in &group.entries {
            let printed = print_output(entry.types(), &opts, false, listing);
            *counts.entry(printed).or_default() += 1;
        }
        let Some((ty, uses)) = counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        else {
            continue;
        };
        // Named after the namespace, so it must be what most of its tools return.
        if uses < MIN_ALIAS_USES
            || 2 * uses <= group.entries.len()
            || ty.len() < MIN_ALIAS_CHARS
            || ty.contains('\n')
            || seen_types.contains(&ty)
        {
            continue;
        }
        let base = group.name.as_deref().unwrap_or_default();
        let base = base.rsplit("__").next().unwrap_or(base);
        let mut name = pascal(base) + "Result";
        let mut n = 2;
        while taken.contains(&name) {
            name = format!("{}Result{n}", pascal(base));
            n += 1;
        }
        taken.push(name.clone());
        seen_types.push(ty.clone());
        named.insert(name, ty);
    }
    named.into_iter().collect()
}

const MIN_ALIAS_USES: usize = 3;
const MIN_ALIAS_CHARS: usize = 20;
const RESERVED_NAMES: &[&str] = &["McpResult", "Block", "Ns", "Result"];

/// `file_system` → `FileSystem`; a name that would not start with a letter gets `Tool` first.
fn pascal(text: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for ch in codemode_spec::to_identifier(text).chars() {
        if ch == '_' || ch == '$' {
            upper = true;
        } else if upper {
            out.extend(ch.to_uppercase());
            upper = false;
        } else {
            out.push(ch);
        }
    }
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "Tool");
    }
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

/// One listed tool. Its comment lines and types are read when it is first printed, once.
struct Entry<'t> {
    tool: &'t ToolSpec,
    key: String,
    collisions: &'t [IdentifierCollision],
    detail: Detail,
    /// The comment lines, and whether the description was cut short.
    comment: OnceCell<(Vec<String>, bool)>,
    types: &'t OnceCell<ToolTypes>,
}

impl<'t> Entry<'t> {
    fn new(
        tool: &'t ToolSpec,
        types: &'t OnceCell<ToolTypes>,
        collisions: &'t [IdentifierCollision],
        detail: Detail,
    ) -> Entry<'t> {
        Entry {
            tool,
            key: member_key(tool, collisions),
            collisions,
            detail,
            comment: OnceCell::new(),
            types,
        }
    }

    fn types(&self) -> &'t ToolTypes {
        self.types.get_or_init(|| ToolTypes::of(self.tool))
    }

    fn comment(&self) -> &(Vec<String>, bool) {
        self.comment.get_or_init(|| {
            let short = self
                .detail
                .description_chars
                .and_then(|max| shorten(&self.tool.description, max));
            let (mut comment, shortened) = match short {
                Some(short) => (foreign_comment_lines(&short), true),
                None => (foreign_comment_lines(&self.tool.description), false),
            };
            if let Some(note) = collision_note(self.tool, self.collisions) {
                comment.push(note);
            }
            (comment, shortened)
        })
    }

    /// Its description as comments, then its signature, named without `prefix` when its group
    /// prints the prefix once.
    fn render(&self, listing: &Listing, detail: Detail, prefix: Option<&str>) -> String {
        let mut out = String::new();
        push_comment(&mut out, &self.comment().0, "");
        let opts = RenderOptions {
            docs: detail.parameter_docs,
            ..RenderOptions::default()
        };
        let key = prefix
            .and_then(|p| self.key.strip_prefix(p))
            .unwrap_or(&self.key);
        out.push_str(&print_signature(key, self.types(), &opts, false, listing));
        out.push('\n');
        out
    }
}

struct Group<'t> {
    name: Option<String>,
    /// What every tool's name starts with (`mcp__memory__`), printed once as `Ns<prefix, …>`.
    prefix: Option<String>,
    description: Vec<String>,
    /// The description was cut (see [`heading_descriptions`]).
    description_shortened: bool,
    /// In name order.
    entries: Vec<Entry<'t>>,
    /// All entries, printed without shared types: counted only when the budget needs it.
    text: String,
    /// Its tokens (an upper bound of what the listing prints), once counted.
    cost: OnceCell<usize>,
}

impl Group<'_> {
    fn cost(&self) -> usize {
        *self
            .cost
            .get_or_init(|| count_tokens(&self.text, Encoding::O200kBase))
    }

    /// Fewer tokens than the group can take: declarations average about 3.5 characters a
    /// token, and no text here comes near this many. Spares counting groups that cannot fit.
    fn cost_at_least(&self) -> usize {
        self.text.len() / MAX_CHARS_PER_TOKEN
    }

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
                let mut out = format!("// ## {}", one_line_name(name));
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

/// `Ns<P, T>`: the members of `T`, each named with the prefix `P` in front.
const NS_TYPE: &str =
    "type Ns<P extends string, T> = { [K in keyof T & string as `${P}${K}`]: T[K] };\n";

/// The prefix a namespace's tools share, `<namespace>__`, when printing it once is shorter: at
/// least three tools, each named by identifier (not a quoted raw name) with an identifier after
/// the prefix.
fn shared_prefix(namespace: &str, entries: &[Entry<'_>]) -> Option<String> {
    let prefix = format!("{namespace}__");
    let all = entries.len() >= 3
        && entries.iter().all(|e| {
            e.key
                .strip_prefix(&prefix)
                .is_some_and(codemode_spec::is_identifier)
        });
    all.then_some(prefix)
}

/// Most characters of a namespace's description in its heading (up to twice as many when its
/// first sentence is that long). An MCP server writes it, and the heading is printed whether or
/// not the budget lists the namespace's tools; `describeNamespace` has it whole.
const NAMESPACE_DESCRIPTION_CHARS: usize = 400;

/// Most o200k tokens of a namespace's description in its heading, whatever its characters: 400
/// characters of English are about this many, of a dense script (hieroglyphs, CJK) many more.
const NAMESPACE_DESCRIPTION_TOKENS: usize = 100;

/// The part of the inline budget that the descriptions in all headings together may take: one
/// `HEADINGS_SHARE`th.
const HEADINGS_SHARE: usize = 2;

/// Each listed namespace's description as heading comment lines, and whether it was shortened.
///
/// Headings are charged before any tools are listed, so what an MCP server writes about itself
/// is bounded twice. Each description is cut after [`NAMESPACE_DESCRIPTION_CHARS`] characters
/// and after [`NAMESPACE_DESCRIPTION_TOKENS`] tokens. And all of them together take at most half
/// the budget: when they would take more, every description is cut to one common length, the
/// largest at which they fit (descriptions shorter than that stay whole), so each gets at least
/// an equal share of that half. One server's text therefore takes at most 100 tokens, and never
/// more than the namespaces' equal share, from the room of other namespaces' tools, and the
/// headings' descriptions never take the description past its budget (a budget of 0 prints no
/// description in a heading). `describeNamespace` has every description whole.
fn heading_descriptions(
    listed: &[&ToolSpec],
    namespaces: &[NamespaceSpec],
    budget: usize,
) -> BTreeMap<String, (Vec<String>, bool)> {
    let names: std::collections::BTreeSet<&str> = listed
        .iter()
        .filter_map(|t| t.namespace.as_deref())
        .collect();
    // (name, lines, shortened, tokens of the lines)
    let mut texts: Vec<(&str, Vec<String>, bool, usize)> = Vec::new();
    for name in names {
        // With duplicate specs for one name, the smallest wins, whatever their order.
        let Some(text) = namespaces
            .iter()
            .filter(|ns| ns.name == name)
            .min_by(|a, b| {
                (&a.description, &a.instructions).cmp(&(&b.description, &b.instructions))
            })
            .and_then(|ns| ns.description.as_deref())
        else {
            continue;
        };
        let (text, shortened) = match shorten(text, NAMESPACE_DESCRIPTION_CHARS) {
            Some(short) => (short, true),
            None => (text.to_string(), false),
        };
        let (lines, shortened) = cut_heading(&text, NAMESPACE_DESCRIPTION_TOKENS, shortened);
        let tokens = count_tokens(&lines.join("\n"), Encoding::O200kBase);
        texts.push((name, lines, shortened, tokens));
    }
    let share = budget / HEADINGS_SHARE;
    if budget != usize::MAX && texts.iter().map(|t| t.3).sum::<usize>() > share {
        // The largest common cap at which they fit: a binary search over 0..=the token cap.
        let fits = |cap: usize| texts.iter().map(|t| t.3.min(cap)).sum::<usize>() <= share;
        let (mut low, mut high) = (0, NAMESPACE_DESCRIPTION_TOKENS);
        while low < high {
            let mid = (low + high).div_ceil(2);
            if fits(mid) {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        for (_, lines, shortened, tokens) in &mut texts {
            if *tokens > low {
                (*lines, *shortened) = cut_heading(&lines.join("\n"), low, *shortened);
            }
        }
    }
    texts
        .into_iter()
        .map(|(name, lines, shortened, _)| (name.to_string(), (lines, shortened)))
        .collect()
}

/// `text` as heading lines in at most `max_tokens` tokens (one line when it had to be cut), and
/// whether it ends in `…` now. Left out whole when not even `…` fits.
fn cut_heading(text: &str, max_tokens: usize, shortened: bool) -> (Vec<String>, bool) {
    match cut_to_tokens(text, max_tokens) {
        Some(cut) if cut.is_empty() => (Vec::new(), false),
        Some(cut) => (foreign_comment_lines(&cut), true),
        None => (foreign_comment_lines(text), shortened),
    }
}

fn one_line_name(name: &str) -> String {
    comment_lines(name).join(" ")
}

fn group_by_namespace<'t>(
    listed: &[&'t ToolSpec],
    types: &'t [OnceCell<ToolTypes>],
    headings: &BTreeMap<String, (Vec<String>, bool)>,
    collisions: &'t [IdentifierCollision],
    detail: Detail,
    budget: usize,
) -> Vec<Group<'t>> {
    let mut by_name: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    for (tool, types) in listed.iter().zip(types) {
        by_name
            .entry(tool.namespace.clone())
            .or_default()
            .push(Entry::new(tool, types, collisions, detail));
    }
    let plain = Listing {
        shared: None,
        doc_chars: detail.parameter_chars,
        shortened: Cell::new(false),
        lean_tags: detail.lean_tags,
        awaited: true,
        result_names: None,
    };
    by_name
        .into_iter()
        .map(|(name, entries)| {
            let (description, description_shortened) = name
                .as_ref()
                .and_then(|n| headings.get(n))
                .cloned()
                .unwrap_or_default();
            let prefix = name.as_deref().and_then(|n| shared_prefix(n, &entries));
            let wrapper = match (&name, &prefix) {
                (None, _) => String::new(),
                (Some(_), Some(p)) => format!("& Ns<{}, {{\n}}>\n", json_string(p)),
                (Some(_), None) => "& {\n}\n".to_string(),
            };
            // One count for the whole group: counting is the slow part for big catalogs. Past
            // what the budget could hold in any case (see `Group::cost_at_least`) the rest is not
            // printed: such a group is not listed, and its tools are never read.
            let most_chars = budget.saturating_mul(MAX_CHARS_PER_TOKEN);
            let mut text = wrapper;
            for entry in &entries {
                if text.len() > most_chars {
                    break;
                }
                text.push_str(&entry.render(&plain, detail, prefix.as_deref()));
            }
            Group {
                name,
                prefix,
                description,
                description_shortened,
                entries,
                text,
                cost: OnceCell::new(),
            }
        })
        .collect()
}

/// Characters per token no listing text averages more than (see [`Group::cost_at_least`]).
const MAX_CHARS_PER_TOKEN: usize = 8;

/// Which groups are listed. Every heading is charged first (in its longer, not-listed form, so
/// the total stays within budget whichever form is printed); then the group without a namespace,
/// then namespaces from the smallest (by characters, ties by name), each if it fits what is left.
/// Tokens are counted only for groups that might fit: counting is the slow part.
fn select(groups: &[Group<'_>], budget: usize) -> Vec<bool> {
    if budget == usize::MAX {
        return vec![true; groups.len()];
    }
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
            .then(a.text.len().cmp(&b.text.len()))
            .then(a.name.cmp(&b.name))
    });
    let mut shown = vec![false; groups.len()];
    for g in order {
        let group = &groups[g];
        if group.cost_at_least() <= remaining && group.cost() <= remaining {
            remaining -= group.cost();
            shown[g] = true;
        }
    }
    shown
}
