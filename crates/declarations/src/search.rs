//! `searchTools`, `describeTool`, `describeNamespace`: finding tools that are not listed.
//!
//! Ranking is BM25 over three fields with different weights: the tool's name and title (most
//! telling), its text (description, parameter names, descriptions and allowed values, and the
//! names of its result's fields) and its namespace's text (least). Results are ordered by exact
//! name match, then by how many query words they cover, then by score, so a query naming a tool
//! always finds it first. A tool that matches only through its namespace's text (a server's
//! instructions mention everything the server does) is left out as soon as some tool matches by
//! its own name or text.

use std::collections::{HashMap, HashSet};

use codemode_spec::{Exposure, NamespaceSpec, ToolSpec, to_identifier};
use serde_json::{Map, Value, json};
use unicode_normalization::UnicodeNormalization;

use crate::description::sorted_unique;
use crate::identifiers::{IdentifierCollision, identifier_collisions, member_key};
use crate::render::sample_with_key;

/// Results returned when the caller does not say.
pub const DEFAULT_SEARCH_LIMIT: usize = 8;

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Field weights, in the order name, text (description and parameters), namespace.
const FIELD_WEIGHTS: [f64; FIELDS] = [3.0, 1.0, 0.5];
const FIELDS: usize = 3;
const NAMESPACE_FIELD: usize = 2;
/// Schema properties read for the text field; bounds work on huge schemas.
const MAX_SCHEMA_WORDS_NODES: usize = 2_000;
/// Longest query `searchTools` reads, in bytes of UTF-8. Normalizing and splitting a query takes
/// up to a hundred times its size (one character can become eighteen in NFKC), and the query comes
/// from a script: a bound keeps that work small, and no topic needs more words.
pub const MAX_QUERY_BYTES: usize = 128 * 1024;
/// Longest unknown name for which the closest names are guessed. Guessing compares the name with
/// every tool's; a longer name is still looked up, but gets no guesses.
const MAX_GUESSED_NAME_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchOptions {
    /// Most results to return; must be at least 1.
    pub limit: usize,
    /// Only tools of this namespace (by name, by identifier, or by the part after `mcp__`).
    pub namespace: Option<String>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            limit: DEFAULT_SEARCH_LIMIT,
            namespace: None,
        }
    }
}

/// One search result, as `searchTools` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The raw tool name.
    pub name: String,
    /// What a script writes after `tools.`.
    pub identifier: String,
    /// The tool's sample ([`crate::tool_sample`]).
    pub description: String,
    pub score: f64,
}

/// An unknown name given to `describeTool` or `describeNamespace`, with the names closest to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("{}", unknown_tool(.name, .closest))]
    UnknownTool { name: String, closest: Vec<String> },
    #[error("{}", unknown_namespace(.name, .known))]
    UnknownNamespace { name: String, known: Vec<String> },
    #[error(
        "describeTool({}, {{schema: true}}): {count} tools share the script name `tools.{name}` ({names}); ask for one by its raw name", shown(.name)
    )]
    Ambiguous {
        name: String,
        count: usize,
        names: String,
    },
}

/// `name` quoted for an error message, cut after 80 characters: a script may pass a name of
/// millions of characters, and an error that repeats it twice made the host hold ten times its
/// size and the worker run out of memory building the exception.
fn shown(name: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    match name.char_indices().nth(SHOWN_CHARS) {
        None => format!("{name:?}"),
        Some((cut, _)) => format!("{:?}… ({} characters)", &name[..cut], name.chars().count()),
    }
}

fn unknown_tool(name: &str, closest: &[String]) -> String {
    let name = shown(name);
    let mut out = format!("describeTool({name}): no tool is named {name}.");
    if closest.is_empty() {
        out.push_str(" None is close;");
    } else {
        let names: Vec<String> = closest.iter().map(|c| format!("tools.{c}")).collect();
        out.push_str(&format!(" Closest: {}.", names.join(", ")));
    }
    out.push_str(" searchTools(\"what it does\") finds tools by topic.");
    out
}

fn unknown_namespace(name: &str, known: &[String]) -> String {
    let name = shown(name);
    match known {
        [] => format!(
            "describeNamespace({name}): there are no namespaces; every tool is in ALL_TOOLS."
        ),
        known => format!(
            "describeNamespace({name}): no namespace is named {name}. Namespaces: {}.",
            known.join(", ")
        ),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error(
        "searchTools() needs words to search for, got an empty query; pass a topic such as searchTools(\"read file\")"
    )]
    EmptyQuery,
    #[error(
        "searchTools() limit must be a positive integer, got 0; omit it for {DEFAULT_SEARCH_LIMIT} results"
    )]
    InvalidLimit,
    #[error(
        "searchTools() takes a query of at most {max} bytes, got {bytes}; search with a few words about what the tool does"
    )]
    QueryTooLong { bytes: usize, max: usize },
}

struct Doc {
    tool: ToolSpec,
    identifier: String,
    /// The name the tool's sample declares it under (its identifier, or its quoted raw name
    /// when the identifier is shared). The sample itself is rendered when asked for: rendering
    /// all of them at once took seconds and tens of megabytes for a server with 5,000 tools.
    key: String,
    /// Normalized names a query may equal exactly: raw name, identifier, local name.
    exact_names: Vec<String>,
    /// Terms of the local name (after the last `__`), for the whole-name bonus.
    local_terms: Vec<String>,
    lengths: [usize; FIELDS],
}

impl Doc {
    /// The tool's sample ([`crate::tool_sample`]), under the key it is declared with.
    fn sample(&self) -> String {
        sample_with_key(&self.tool, &self.key)
    }
}

/// A search index over the callable tools (hidden tools are left out).
pub struct ToolIndex {
    docs: Vec<Doc>,
    namespaces: Vec<NamespaceSpec>,
    /// term → (doc, field, term frequency)
    postings: HashMap<String, Vec<(usize, usize, u32)>>,
    /// term → number of docs containing it in any field
    doc_freq: HashMap<String, usize>,
    average_lengths: [f64; FIELDS],
    collisions: Vec<IdentifierCollision>,
}

impl ToolIndex {
    /// Indexes `tools`. Registration order does not matter: tools are sorted by name.
    pub fn new(tools: &[ToolSpec], namespaces: &[NamespaceSpec]) -> ToolIndex {
        let tools: Vec<ToolSpec> = sorted_unique(tools)
            .into_iter()
            .filter(|t| t.exposure != Exposure::Hidden)
            .cloned()
            .collect();
        let collisions = identifier_collisions(&tools);
        // Sorted and one per name, so duplicate specs resolve the same whatever their order.
        let mut namespaces = namespaces.to_vec();
        namespaces.sort_by(|a, b| {
            (&a.name, &a.description, &a.instructions).cmp(&(
                &b.name,
                &b.description,
                &b.instructions,
            ))
        });
        namespaces.dedup_by(|a, b| a.name == b.name);
        let mut postings: HashMap<String, Vec<(usize, usize, u32)>> = HashMap::new();
        let mut doc_freq: HashMap<String, usize> = HashMap::new();
        let mut totals = [0usize; FIELDS];
        let mut docs = Vec::with_capacity(tools.len());

        for (index, tool) in tools.into_iter().enumerate() {
            let namespace = tool
                .namespace
                .as_ref()
                .map(|n| namespace_text(n, &namespaces))
                .unwrap_or_default();
            let mut name_text = tool.name.clone();
            if let Some(title) = &tool.annotations.title {
                name_text.push(' ');
                name_text.push_str(title);
            }
            let texts = [name_text, tool_text(&tool), namespace];
            let mut lengths = [0usize; FIELDS];
            // A set: a hostile schema can carry hundreds of thousands of distinct words.
            let mut seen_in_doc: HashSet<String> = HashSet::new();
            for (field, text) in texts.iter().enumerate() {
                let terms = tokenize(text);
                lengths[field] = terms.len();
                totals[field] += terms.len();
                let mut counts: HashMap<String, u32> = HashMap::new();
                for term in terms {
                    *counts.entry(term).or_default() += 1;
                }
                let mut counts: Vec<(String, u32)> = counts.into_iter().collect();
                counts.sort();
                for (term, tf) in counts {
                    if seen_in_doc.insert(term.clone()) {
                        *doc_freq.entry(term.clone()).or_default() += 1;
                    }
                    postings.entry(term).or_default().push((index, field, tf));
                }
            }
            let identifier = tool.identifier();
            let key = member_key(&tool, &collisions);
            let local = tool
                .name
                .rsplit("__")
                .next()
                .unwrap_or(&tool.name)
                .to_string();
            docs.push(Doc {
                key,
                exact_names: vec![
                    normalize(&tool.name),
                    normalize(&identifier),
                    normalize(&local),
                ],
                local_terms: tokenize(&local),
                identifier,
                lengths,
                tool,
            });
        }
        let count = docs.len().max(1) as f64;
        let average_lengths = totals.map(|t| (t as f64 / count).max(1.0));
        ToolIndex {
            docs,
            namespaces,
            postings,
            doc_freq,
            average_lengths,
            collisions,
        }
    }

    /// Ranks the tools for `query`. An empty (or blank) query and a zero limit are errors; a query
    /// of only stop words finds nothing. Long queries are fine (each distinct word is scored once)
    /// up to [`MAX_QUERY_BYTES`]; a longer one is an error.
    pub fn search(&self, query: &str, opts: &SearchOptions) -> Result<Vec<SearchHit>, SearchError> {
        if query.trim().is_empty() {
            return Err(SearchError::EmptyQuery);
        }
        if opts.limit == 0 {
            return Err(SearchError::InvalidLimit);
        }
        if query.len() > MAX_QUERY_BYTES {
            return Err(SearchError::QueryTooLong {
                bytes: query.len(),
                max: MAX_QUERY_BYTES,
            });
        }
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        let exact = normalize(query);
        let n = self.docs.len() as f64;

        let mut scores: HashMap<usize, (f64, usize)> = HashMap::new();
        let mut matched: HashMap<usize, Vec<&str>> = HashMap::new();
        // Docs matched by their own name or text, not only by their namespace's text.
        let mut own: Vec<bool> = vec![false; self.docs.len()];
        for term in &terms {
            let Some(postings) = self.postings.get(term) else {
                continue;
            };
            let df = self.doc_freq.get(term).copied().unwrap_or(0) as f64;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for &(doc, field, tf) in postings {
                let tf = f64::from(tf);
                let length = self.docs[doc].lengths[field] as f64;
                let norm = 1.0 - B + B * length / self.average_lengths[field];
                let score = FIELD_WEIGHTS[field] * idf * tf * (K1 + 1.0) / (tf + K1 * norm);
                scores.entry(doc).or_default().0 += score;
                if field != NAMESPACE_FIELD {
                    own[doc] = true;
                }
                let seen = matched.entry(doc).or_default();
                if !seen.contains(&term.as_str()) {
                    seen.push(term);
                }
            }
        }

        let in_scope = |doc: &Doc| match &opts.namespace {
            Some(namespace) => doc
                .tool
                .namespace
                .as_deref()
                .is_some_and(|n| namespace_matches(n, namespace)),
            None => true,
        };
        let any_own = self
            .docs
            .iter()
            .enumerate()
            .any(|(i, d)| own[i] && in_scope(d));
        let mut ranked: Vec<(bool, usize, f64, usize)> = Vec::new();
        for (doc_index, doc) in self.docs.iter().enumerate() {
            if let Some(namespace) = &opts.namespace
                && !doc
                    .tool
                    .namespace
                    .as_deref()
                    .is_some_and(|n| namespace_matches(n, namespace))
            {
                continue;
            }
            let is_exact = !exact.is_empty() && doc.exact_names.contains(&exact);
            let Some((mut score, _)) = scores.get(&doc_index).copied() else {
                if is_exact {
                    ranked.push((true, 0, 0.0, doc_index));
                }
                continue;
            };
            if any_own && !own[doc_index] && !is_exact {
                continue;
            }
            let covered = matched.get(&doc_index).map_or(0, Vec::len);
            if !doc.local_terms.is_empty()
                && doc
                    .local_terms
                    .iter()
                    .all(|t| terms.binary_search(t).is_ok())
            {
                for term in &doc.local_terms {
                    let df = self.doc_freq.get(term).copied().unwrap_or(0) as f64;
                    score += (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                }
            }
            ranked.push((is_exact, covered, score, doc_index));
        }
        ranked.sort_by(|a, b| {
            b.0.cmp(&a.0)
                .then(b.1.cmp(&a.1))
                .then(b.2.total_cmp(&a.2))
                .then(a.3.cmp(&b.3))
        });
        Ok(ranked
            .into_iter()
            .take(opts.limit)
            .map(|(_, _, score, doc)| {
                let doc = &self.docs[doc];
                SearchHit {
                    name: doc.tool.name.clone(),
                    identifier: doc.identifier.clone(),
                    description: doc.sample(),
                    score,
                }
            })
            .collect())
    }

    /// The sample of the tool whose raw name, or else identifier, is `name_or_identifier`. When
    /// several tools share the identifier, all their samples, each saying how to call it. An
    /// unknown name is an error naming the closest tools.
    pub fn describe_tool(&self, name_or_identifier: &str) -> Result<String, LookupError> {
        match self.lookup(name_or_identifier).as_slice() {
            [] => Err(LookupError::UnknownTool {
                name: name_or_identifier.to_string(),
                closest: self.closest_tools(name_or_identifier),
            }),
            [one] => Ok(one.sample()),
            many => {
                let names: Vec<&str> = many.iter().map(|d| d.tool.name.as_str()).collect();
                let mut out = format!(
                    "`tools.{name_or_identifier}` is ambiguous: {} tools share it ({}). Call each by its raw name.",
                    many.len(),
                    names.join(", ")
                );
                for doc in many {
                    out.push_str("\n\n");
                    out.push_str(&doc.sample());
                }
                Ok(out)
            }
        }
    }

    /// The input JSON Schema of a tool, found as [`ToolIndex::describe_tool`] finds it.
    pub fn input_schema(&self, name_or_identifier: &str) -> Result<Value, LookupError> {
        match self.lookup(name_or_identifier).as_slice() {
            [] => Err(LookupError::UnknownTool {
                name: name_or_identifier.to_string(),
                closest: self.closest_tools(name_or_identifier),
            }),
            [one] => Ok(one.tool.input_schema.value()),
            many => Err(LookupError::Ambiguous {
                name: name_or_identifier.to_string(),
                count: many.len(),
                names: many
                    .iter()
                    .map(|d| d.tool.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The tool with this raw name, else the tools with this identifier.
    fn lookup(&self, name_or_identifier: &str) -> Vec<&Doc> {
        if let Some(doc) = self.docs.iter().find(|d| d.tool.name == name_or_identifier) {
            return vec![doc];
        }
        self.docs
            .iter()
            .filter(|d| d.identifier == name_or_identifier)
            .collect()
    }

    /// Up to five identifiers close to `wanted`: the same letters and digits, one name inside the
    /// other, a few typos (in the whole name or the part after the namespace), or when none is
    /// that close, names sharing a word with it. Descriptions are not consulted: a name that matches nothing gets no guesses.
    fn closest_tools(&self, wanted: &str) -> Vec<String> {
        if wanted.len() > MAX_GUESSED_NAME_BYTES {
            return Vec::new();
        }
        let want = normalize(wanted);
        let want_chars = want.chars().count();
        let want_terms: HashSet<String> = tokenize(wanted).into_iter().collect();
        let mut scored: Vec<(usize, &str)> = Vec::new();
        for doc in &self.docs {
            let local = doc.tool.name.rsplit("__").next().unwrap_or(&doc.tool.name);
            let similar = doc
                .exact_names
                .iter()
                .chain(std::iter::once(&normalize(local)))
                .filter(|n| !n.is_empty() && !want.is_empty())
                .filter_map(|n| {
                    if *n == want {
                        return Some(0);
                    }
                    // Lengths first: they are cheap, the searches are not.
                    let inside = 2 * want.len() >= n.len() && n.contains(&want);
                    let around = 2 * n.len() >= want.len() && want.contains(n.as_str());
                    if inside || around {
                        return Some(1);
                    }
                    let most = (n.len().max(want.len()) / 3).max(2);
                    // The distance is at least the difference in length: skip what cannot be close.
                    if n.chars().count().abs_diff(want_chars) > most {
                        return None;
                    }
                    let distance = strsim::levenshtein(n, &want);
                    (distance <= most).then_some(1 + distance)
                })
                .min();
            let shared_words = doc
                .local_terms
                .iter()
                .filter(|t| t.len() > 2 && want_terms.contains(*t))
                .count();
            let score = match (similar, shared_words) {
                (Some(s), _) => s,
                (None, 0) => continue,
                (None, n) => 100 - n.min(50),
            };
            scored.push((score, &doc.identifier));
        }
        // Names sharing only a word are guesses: shown when nothing is closer.
        if scored.iter().any(|(score, _)| *score < 50) {
            scored.retain(|(score, _)| *score < 50);
        }
        scored.sort();
        let mut out: Vec<String> = Vec::new();
        for (_, identifier) in scored {
            if !out.iter().any(|o| o == identifier) {
                out.push(identifier.to_string());
            }
            if out.len() == 5 {
                break;
            }
        }
        out
    }

    /// `{name, description?, instructions?, tools: [identifiers]}` for the first namespace whose
    /// name matches (literally, as an identifier, or by the part after `mcp__`). An unknown name is
    /// an error listing the namespaces there are (the closest first).
    pub fn describe_namespace(&self, name: &str) -> Result<Value, LookupError> {
        let mut candidates: Vec<NamespaceSpec> = self.namespaces.clone();
        for doc in &self.docs {
            if let Some(ns) = &doc.tool.namespace
                && !candidates.iter().any(|c| &c.name == ns)
            {
                candidates.push(NamespaceSpec {
                    name: ns.clone(),
                    ..NamespaceSpec::default()
                });
            }
        }
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        let Some(found) = candidates
            .iter()
            .find(|c| c.name == name)
            .or_else(|| candidates.iter().find(|c| namespace_matches(&c.name, name)))
        else {
            // A name longer than any guess is worth lists the namespaces by name alone.
            let want = (name.len() <= MAX_GUESSED_NAME_BYTES).then(|| normalize(name));
            let mut known: Vec<(usize, String)> = candidates
                .iter()
                .map(|c| {
                    let distance = want
                        .as_ref()
                        .map_or(0, |w| strsim::levenshtein(&normalize(&c.name), w));
                    (distance, c.name.clone())
                })
                .collect();
            known.sort();
            return Err(LookupError::UnknownNamespace {
                name: name.to_string(),
                known: known.into_iter().take(20).map(|(_, n)| n).collect(),
            });
        };
        let mut out = Map::new();
        out.insert("name".into(), json!(found.name));
        if let Some(description) = &found.description {
            out.insert("description".into(), json!(description));
        }
        if let Some(instructions) = &found.instructions {
            out.insert("instructions".into(), json!(instructions));
        }
        if let Some(unavailable) = &found.unavailable {
            out.insert("unavailable".into(), json!(unavailable));
        }
        let tools: Vec<Value> = self
            .docs
            .iter()
            .filter(|d| d.tool.namespace.as_deref() == Some(found.name.as_str()))
            .map(|d| json!(d.identifier))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
        Ok(Value::Object(out))
    }

    /// Every indexed tool as `ALL_TOOLS` lists it, sorted by name (score 0).
    pub fn all_tools(&self) -> Vec<SearchHit> {
        self.docs
            .iter()
            .map(|d| SearchHit {
                name: d.tool.name.clone(),
                identifier: d.identifier.clone(),
                description: d.sample(),
                score: 0.0,
            })
            .collect()
    }

    /// Identifiers shared by several tools among the indexed ones.
    pub fn collisions(&self) -> &[IdentifierCollision] {
        &self.collisions
    }
}

/// `dev-radius` matches `mcp__dev_radius`: equal as identifiers, or equal to the part after `__`.
fn namespace_matches(namespace: &str, query: &str) -> bool {
    let ns = to_identifier(namespace);
    let q = to_identifier(query);
    namespace == query || ns == q || ns.strip_suffix(&q).is_some_and(|head| head.ends_with("__"))
}

fn namespace_text(name: &str, namespaces: &[NamespaceSpec]) -> String {
    let mut text = name.to_string();
    if let Some(ns) = namespaces.iter().find(|n| n.name == name) {
        for part in [&ns.description, &ns.instructions].into_iter().flatten() {
            text.push(' ');
            text.push_str(part);
        }
    }
    text
}

/// The description, the parameters' names, descriptions and allowed values, and the names of
/// the result's fields (of an MCP result, its structured content's): a bounded walk of the schemas.
fn tool_text(tool: &ToolSpec) -> String {
    let mut text = tool.description.clone();
    let mut budget = MAX_SCHEMA_WORDS_NODES;
    schema_words(&tool.input_schema.value(), &mut text, &mut budget, 0, true);
    if let Some(output) = &tool.output_schema {
        let output = &output.value();
        match crate::mcp_result::structured_content(output) {
            Some(Some(structured)) => schema_words(&structured, &mut text, &mut budget, 0, false),
            Some(None) => {}
            None => schema_words(output, &mut text, &mut budget, 0, false),
        }
    }
    text
}

/// Appends property names (and for inputs, their descriptions and string values) to `out`.
fn schema_words(schema: &Value, out: &mut String, budget: &mut usize, depth: usize, input: bool) {
    if depth > 4 || *budget == 0 {
        return;
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        out.push(' ');
        out.push_str(name);
        if input {
            if let Some(description) = property.get("description").and_then(Value::as_str) {
                out.push(' ');
                out.push_str(description);
            }
            let values = property.get("enum").and_then(Value::as_array);
            // As many values as the declaration lists: a huge enum is not worth indexing.
            let values = values.into_iter().flatten();
            for value in values
                .take(crate::schema::MAX_ENUM_VALUES)
                .filter_map(Value::as_str)
            {
                out.push(' ');
                out.push_str(value);
            }
        }
        schema_words(property, out, budget, depth + 1, input);
        if let Some(items) = property.get("items") {
            schema_words(items, out, budget, depth + 1, input);
        }
    }
}

/// Lower-case letters and digits only: how exact-name matches compare.
fn normalize(text: &str) -> String {
    text.nfkc()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
    "or", "that", "the", "this", "to", "with",
];

/// Search terms: text in NFKC form split at non-alphanumerics and camelCase humps (`readFile`,
/// `HTTPServer`, `snake_case`, `kebab-case`), lower-cased, stop words removed, simple plurals made
/// singular. Ideographic and kana characters are terms on their own, since those scripts do not
/// use spaces.
pub(crate) fn tokenize(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    // ASCII is its own NFKC form; normalizing it anyway was most of the time an index of
    // thousands of tools took to build.
    let chars: Vec<char> = if text.is_ascii() {
        text.chars().collect()
    } else {
        text.nfkc().collect()
    };
    let mut current = String::new();
    for (i, &ch) in chars.iter().enumerate() {
        if is_cjk(ch) {
            flush(&mut current, &mut words);
            words.push(ch.to_string());
            continue;
        }
        if !ch.is_alphanumeric() {
            flush(&mut current, &mut words);
            continue;
        }
        if ch.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|c| c.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                flush(&mut current, &mut words);
            }
        }
        current.push(ch);
    }
    flush(&mut current, &mut words);
    words
        .into_iter()
        .map(|w| w.to_lowercase())
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(singular)
        .collect()
}

fn flush(current: &mut String, words: &mut Vec<String>) {
    if !current.is_empty() {
        words.push(std::mem::take(current));
    }
}

fn is_cjk(ch: char) -> bool {
    matches!(ch as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FA1F)
}

pub(crate) fn singular(word: String) -> String {
    if let Some(stem) = word.strip_suffix("ies")
        && stem.chars().count() >= 2
    {
        return format!("{stem}y");
    }
    for suffix in ["ches", "shes", "sses", "xes", "zes"] {
        if word.ends_with(suffix) {
            return word[..word.len() - 2].to_string();
        }
    }
    if word.ends_with('s') && !word.ends_with("ss") && word.chars().count() > 3 {
        return word[..word.len() - 1].to_string();
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_splits_cases_and_singularizes() {
        assert_eq!(
            tokenize("readFile HTTPServer"),
            vec!["read", "file", "http", "server"]
        );
        assert_eq!(
            tokenize("search_issues list-directories"),
            vec!["search", "issue", "list", "directory"]
        );
        assert_eq!(tokenize("The boxes of Ärger"), vec!["box", "ärger"]);
        assert_eq!(
            tokenize("ファイル読む"),
            vec!["フ", "ァ", "イ", "ル", "読", "む"]
        );
        assert_eq!(tokenize("class address"), vec!["class", "address"]);
        // Decomposed and composed forms, fullwidth letters: the same terms.
        assert_eq!(tokenize("cafe\u{301} ＦＩＬＥ"), tokenize("café file"));
    }

    #[test]
    fn namespace_aliases() {
        assert!(namespace_matches("mcp__dev_radius", "dev-radius"));
        assert!(namespace_matches("mcp__dev_radius", "mcp__dev-radius"));
        assert!(!namespace_matches("mcp__dev_radius", "radius"));
    }
}
