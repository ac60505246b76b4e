//! Printing types and declarations: [`render_type`], [`render_declaration`], [`tool_sample`].
//!
//! Layout aims at few tokens without losing anything the model needs: objects stay on one line
//! while nothing needs a comment, a comment that fits rides at the end of its member's line, and
//! the closing `;` before `}` is left out. Members are indented two spaces per level so nested
//! objects read correctly.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use codemode_spec::ToolSpec;
use serde_json::Value;

use crate::mcp_result::structured_content;
use crate::schema::{self, Object, Ty};
use crate::shared::SharedTypes;
use crate::text::{comment_lines, foreign_comment_lines, json_string, shorten};

/// How [`render_type`] and [`render_declaration`] print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Constraint tags (`@min 1`, `@pattern …`). Dropped first when a type is too long.
    pub tags: bool,
    /// Property descriptions as comments. Dropped second when a type is too long.
    pub docs: bool,
    /// Longest type, in characters, before details are dropped; past that with no details left the
    /// type becomes `unknown` (which still lets the script call the tool).
    pub max_chars: usize,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            tags: true,
            docs: true,
            max_chars: DEFAULT_MAX_TYPE_CHARS,
        }
    }
}

/// Same bound the reference uses for input types, so big schemas degrade at the same point.
pub const DEFAULT_MAX_TYPE_CHARS: usize = 16_000;

/// An object whose members fit on a line this long stays on one line.
const INLINE_MAX_CHARS: usize = 150;
const INDENT: &str = "  ";

/// Converts a JSON Schema into a TypeScript type expression.
///
/// Accepts any JSON value: `true` and non-objects are `unknown`, `false` is `never`. Local `$ref`s
/// resolve against `schema`; recursive, remote and missing ones are `unknown`. When the result is
/// longer than `opts.max_chars`, it is printed again without tags, then without comments, and
/// becomes `unknown` if still too long.
pub fn render_type(schema: &Value, opts: &RenderOptions) -> String {
    let ty = schema::build(schema);
    print_bounded(&ty, opts, &Listing::default())
}

/// What printing inside the codemode description adds: names of shared types, and shortened
/// property comments (the full text stays in `describeTool`).
#[derive(Default)]
pub(crate) struct Listing<'a> {
    pub shared: Option<&'a SharedTypes>,
    /// Property comments longer than this many characters are shortened.
    pub doc_chars: Option<usize>,
    /// Set when some comment was shortened.
    pub shortened: Cell<bool>,
    /// Leave out tags a call passes validation without knowing: `@default`, `@minLen 1`.
    pub lean_tags: bool,
    /// Print a tool's result as what `await` gives (`R`, not `Promise<R>`); the description's
    /// API text says so once instead of every declaration.
    pub awaited: bool,
    /// Result types many tools of a namespace share, printed once as `type <Name> = …` and
    /// written by name (printed type → name).
    pub result_names: Option<&'a HashMap<String, String>>,
}

pub(crate) fn print_bounded(ty: &Ty, opts: &RenderOptions, listing: &Listing) -> String {
    let mut attempts = vec![(opts.tags, opts.docs)];
    if opts.tags {
        attempts.push((false, opts.docs));
    }
    if opts.docs {
        attempts.push((false, false));
    }
    for (tags, docs) in attempts {
        let text = Printer {
            tags,
            docs,
            listing,
        }
        .ty(ty, 0);
        if text.len() <= opts.max_chars {
            return text;
        }
    }
    "unknown".to_string()
}

/// An object type printed on one line without comments or tags: two objects with the same key
/// have the same shape.
pub(crate) fn shape_key(object: &Object) -> String {
    Printer {
        tags: false,
        docs: false,
        listing: &Listing::default(),
    }
    .object(object, 0)
}

/// `type Name = { … };` for a shared object type, with comments and tags.
pub(crate) fn print_shared(name: &str, object: &Object, listing: &Listing) -> String {
    let body = Printer {
        tags: true,
        docs: true,
        listing,
    }
    .object(object, 0);
    format!("type {name} = {body};\n")
}

/// A tool's input and output, read from its schemas once.
pub(crate) struct ToolTypes {
    pub input: Ty,
    pub output: Output,
}

pub(crate) enum Output {
    /// No output schema: the call resolves to the tool's text.
    Text,
    Type(Ty),
    /// An MCP result, with the type of its structured content when the tool declares one.
    Mcp(Option<Ty>),
}

impl ToolTypes {
    pub(crate) fn of(spec: &ToolSpec) -> ToolTypes {
        let output = match &spec.output_schema {
            None => Output::Text,
            Some(schema) => {
                let schema = &schema.value();
                match structured_content(schema) {
                    Some(None) => Output::Mcp(None),
                    Some(Some(structured)) => Output::Mcp(Some(schema::build(&structured))),
                    None => Output::Type(schema::build(schema)),
                }
            }
        };
        ToolTypes {
            input: schema::build(&spec.input_schema.value()),
            output,
        }
    }

    /// The types a listing prints, for finding shared ones: the input, then the output.
    pub(crate) fn trees(&self) -> Vec<&Ty> {
        let mut out = vec![&self.input];
        match &self.output {
            Output::Type(t) | Output::Mcp(Some(t)) => out.push(t),
            Output::Text | Output::Mcp(None) => {}
        }
        out
    }
}

/// One tool as a member of `tools`: its description as `//` comment lines, then
/// `name(args: T): Promise<R>;`. A tool without an output schema resolves to its text, hence
/// `Promise<string>`.
///
/// An MCP tool's result is written `McpResult<S>`, the type the codemode description declares.
pub fn render_declaration(spec: &ToolSpec, opts: &RenderOptions) -> String {
    let mut out = String::new();
    if opts.docs {
        push_comment(&mut out, &foreign_comment_lines(&spec.description), "");
    }
    out.push_str(&signature(spec, &spec.identifier(), opts, opts.docs));
    out
}

/// What `ALL_TOOLS`, `describeTool` and `searchTools` show for one tool: the description as prose,
/// then its declaration in a TypeScript block.
pub fn tool_sample(spec: &ToolSpec) -> String {
    sample_with_key(spec, &spec.identifier())
}

/// What `ALL_TOOLS` lists as each tool's `description`, in `specs`' order. Every namespace (the
/// tools without one count as one) has an equal share of `max_bytes`: within it, its tools'
/// samples while they all fit, else each tool's description alone, cut to an equal part of the
/// share (`…` marks a cut). Every script gets the whole list, so a listing of thousands of tools
/// with large schemas would otherwise cost each script start tens of megabytes of host memory
/// and copying, and shares keep one server's size from cutting the others' text; `describeTool`
/// still gives any tool's whole sample.
pub fn all_tools_descriptions(specs: &[ToolSpec], max_bytes: usize) -> Vec<String> {
    let mut namespaces: std::collections::BTreeMap<Option<&str>, Vec<usize>> = Default::default();
    for (i, spec) in specs.iter().enumerate() {
        namespaces
            .entry(spec.namespace.as_deref())
            .or_default()
            .push(i);
    }
    let share = max_bytes / namespaces.len().max(1);
    let mut out = vec![String::new(); specs.len()];
    for members in namespaces.into_values() {
        let mut samples = Vec::with_capacity(members.len());
        let mut total = 0usize;
        for &i in &members {
            let sample = tool_sample(&specs[i]);
            total = total.saturating_add(sample.len());
            if total > share {
                break;
            }
            samples.push(sample);
        }
        if samples.len() == members.len() {
            for (&i, sample) in members.iter().zip(samples) {
                out[i] = sample;
            }
            continue;
        }
        drop(samples);
        let part = (share / members.len()).min(MAX_SHORT_DESCRIPTION_BYTES);
        for &i in &members {
            out[i] = cut_description(&specs[i].description, part);
        }
    }
    out
}

/// `description` as one line of at most `max` bytes.
fn cut_description(description: &str, max: usize) -> String {
    let text = comment_lines(description).join(" ");
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", text[..end].trim_end())
}

/// The longest description `ALL_TOOLS` keeps of a tool once samples do not fit.
const MAX_SHORT_DESCRIPTION_BYTES: usize = 400;

pub(crate) fn sample_with_key(spec: &ToolSpec, key: &str) -> String {
    // Same cleaning as comments: no stray control characters, no fence that closes the block early.
    let description = comment_lines(&spec.description).join("\n");
    let declaration = signature(spec, key, &RenderOptions::default(), true);
    let block = format!("```ts\ndeclare const tools: {{\n{declaration}\n}};\n```");
    if description.is_empty() {
        block
    } else {
        format!("{description}\n\n{block}")
    }
}

/// `key(args: T): Promise<R>;` where `key` is the identifier, or the quoted raw name when the
/// identifier is shared with another tool. `output_docs` keeps comments in the result type; the
/// description leaves them out (field names mostly speak for themselves, and `describeTool` has
/// them), which saves many tokens on MCP tools with big output schemas.
pub(crate) fn signature(
    spec: &ToolSpec,
    key: &str,
    opts: &RenderOptions,
    output_docs: bool,
) -> String {
    print_signature(
        key,
        &ToolTypes::of(spec),
        opts,
        output_docs,
        &Listing::default(),
    )
}

pub(crate) fn print_signature(
    key: &str,
    types: &ToolTypes,
    opts: &RenderOptions,
    output_docs: bool,
    listing: &Listing,
) -> String {
    let input = print_bounded(&types.input, opts, listing);
    let output = print_output(types, opts, output_docs, listing);
    let output = listing
        .result_names
        .and_then(|names| names.get(&output))
        .cloned()
        .unwrap_or(output);
    if listing.awaited {
        format!("{key}(args: {input}): {output}")
    } else {
        format!("{key}(args: {input}): Promise<{output}>;")
    }
}

/// A tool's result type as printed, before any alias.
pub(crate) fn print_output(
    types: &ToolTypes,
    opts: &RenderOptions,
    output_docs: bool,
    listing: &Listing,
) -> String {
    // Tags describe what a caller must send; on results they only cost tokens.
    let output_opts = RenderOptions {
        tags: false,
        docs: output_docs && opts.docs,
        ..opts.clone()
    };
    match &types.output {
        Output::Text => "string".to_string(),
        Output::Type(ty) => print_bounded(ty, &output_opts, listing),
        Output::Mcp(None) => "McpResult".to_string(),
        Output::Mcp(Some(ty)) => match print_bounded(ty, &output_opts, listing).as_str() {
            "unknown" => "McpResult".to_string(),
            structured => format!("McpResult<{structured}>"),
        },
    }
}

/// The member key for a tool: its identifier, or its JSON-quoted raw name.
pub(crate) fn quoted_key(name: &str) -> String {
    json_string(name)
}

/// Appends `// line` for each line (blank lines as `//`), each prefixed by `indent`.
pub(crate) fn push_comment(out: &mut String, lines: &[String], indent: &str) {
    for line in lines {
        out.push_str(indent);
        if line.is_empty() {
            out.push_str("//\n");
        } else {
            out.push_str("// ");
            out.push_str(line);
            out.push('\n');
        }
    }
}

struct Printer<'l, 'a> {
    tags: bool,
    docs: bool,
    listing: &'l Listing<'a>,
}

impl Printer<'_, '_> {
    fn ty(&self, ty: &Ty, level: usize) -> String {
        match ty {
            Ty::Unknown => "unknown".into(),
            Ty::Never => "never".into(),
            Ty::Atom(text) => text.clone(),
            Ty::Union(members) => {
                let mut parts: Vec<String> = Vec::with_capacity(members.len());
                let mut seen: HashSet<String> = HashSet::with_capacity(members.len());
                for member in members {
                    let text = self.ty(member, level);
                    let text = match member {
                        Ty::Intersection(_) => format!("({text})"),
                        _ => text,
                    };
                    if seen.insert(text.clone()) {
                        parts.push(text);
                    }
                }
                parts.join(" | ")
            }
            Ty::Intersection(parts) => parts
                .iter()
                .map(|part| {
                    let text = self.ty(part, level);
                    match part {
                        Ty::Union(_) => format!("({text})"),
                        _ => text,
                    }
                })
                .collect::<Vec<_>>()
                .join(" & "),
            Ty::Array(item) => self.element(item, level) + "[]",
            Ty::Tuple { items, rest } => {
                let mut parts: Vec<String> = items.iter().map(|i| self.ty(i, level)).collect();
                if let Some(rest) = rest {
                    parts.push(format!("...{}[]", self.element(rest, level)));
                }
                format!("[{}]", parts.join(", "))
            }
            Ty::Object(object) => match self.shared_name(object) {
                Some(name) => name,
                None => self.object(object, level),
            },
        }
    }

    fn shared_name(&self, object: &Object) -> Option<String> {
        let shared = self.listing.shared?;
        shared.name_of(&shape_key(object)).map(str::to_string)
    }

    /// A property's comment lines, shortened in a listing when they are long.
    fn doc(&self, lines: &[String]) -> Vec<String> {
        let Some(max) = self.listing.doc_chars else {
            return lines.to_vec();
        };
        match shorten(&lines.join("\n"), max) {
            Some(short) => {
                self.listing.shortened.set(true);
                vec![short]
            }
            None => lines.to_vec(),
        }
    }

    /// An array element, parenthesized when `[]` would otherwise bind to its last member.
    fn element(&self, item: &Ty, level: usize) -> String {
        let text = self.ty(item, level);
        match item {
            Ty::Union(_) | Ty::Intersection(_) => format!("({text})"),
            _ => text,
        }
    }

    fn object(&self, object: &Object, level: usize) -> String {
        if object.props.is_empty() {
            return match &object.index {
                None => "{}".into(),
                Some(index) => format!("Record<string, {}>", self.ty(index, level)),
            };
        }
        let members: Vec<(String, String, Vec<String>)> = object
            .props
            .iter()
            .map(|prop| {
                let ty = self.ty(&prop.ty, level + 1);
                let head = format!("{}{}: {ty}", prop.key, if prop.optional { "?" } else { "" });
                let mut comment: Vec<String> = if self.docs {
                    self.doc(&prop.doc)
                } else {
                    Vec::new()
                };
                let tags: Vec<&str> = prop
                    .tags
                    .iter()
                    .map(String::as_str)
                    .filter(|t| {
                        !(self.listing.lean_tags
                            && (t.starts_with("@default") || *t == "@minLen 1"))
                    })
                    .collect();
                if self.tags && !tags.is_empty() {
                    let tags = tags.join(" ");
                    match comment.last_mut() {
                        Some(last) if !last.is_empty() => {
                            last.push(' ');
                            last.push_str(&tags);
                        }
                        _ => comment.push(tags),
                    }
                }
                (head, ty, comment)
            })
            .collect();
        let index = object
            .index
            .as_ref()
            .map(|i| format!("[key: string]: {}", self.ty(i, level + 1)));

        let plain = members
            .iter()
            .all(|(head, _, comment)| comment.is_empty() && !head.contains('\n'));
        if plain {
            let mut parts: Vec<&str> = members.iter().map(|(h, _, _)| h.as_str()).collect();
            if let Some(index) = &index {
                parts.push(index);
            }
            let line = format!("{{ {} }}", parts.join("; "));
            if line.len() <= INLINE_MAX_CHARS {
                return line;
            }
        }

        let pad = INDENT.repeat(level + 1);
        let mut out = String::from("{\n");
        for (head, ty, comment) in &members {
            // Line breaks separate members, so no `;` is needed.
            if comment.len() == 1 && !ty.contains('\n') {
                out.push_str(&format!("{pad}{head} // {}\n", comment[0]));
            } else {
                push_comment(&mut out, comment, &pad);
                out.push_str(&format!("{pad}{head}\n"));
            }
        }
        if let Some(index) = index {
            out.push_str(&format!("{pad}{index}\n"));
        }
        out.push_str(&INDENT.repeat(level));
        out.push('}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(schema: Value) -> String {
        render_type(&schema, &RenderOptions::default())
    }

    #[test]
    fn primitives_and_literals() {
        assert_eq!(ts(json!(true)), "unknown");
        assert_eq!(ts(json!(false)), "never");
        assert_eq!(ts(json!(42)), "unknown");
        assert_eq!(ts(json!({"type": ["string", "null"]})), "string | null");
        assert_eq!(ts(json!({"enum": ["a", 1, null]})), "\"a\" | 1 | null");
        assert_eq!(ts(json!({"const": "x"})), "\"x\"");
    }

    #[test]
    fn objects_sort_quote_and_index() {
        let t = ts(
            json!({"type": "object", "properties": {"b": {"type": "number"}, "a-b": {"type": "string"}}, "required": ["b"]}),
        );
        assert_eq!(t, "{ \"a-b\"?: string; b: number }");
        assert_eq!(ts(json!({"type": "object"})), "Record<string, unknown>");
        assert_eq!(ts(json!({"type": "object", "properties": {}})), "{}");
        let t = ts(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "number"}}),
        );
        assert_eq!(t, "{ a?: string } & Record<string, number>");
    }

    #[test]
    fn arrays_and_tuples() {
        assert_eq!(
            ts(json!({"type": "array", "items": {"type": ["string", "number"]}})),
            "(string | number)[]"
        );
        assert_eq!(
            ts(json!({"prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})),
            "[string, number]"
        );
        assert_eq!(ts(json!({"type": "array"})), "unknown[]");
    }

    #[test]
    fn refs_and_recursion() {
        let t = ts(
            json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}),
        );
        assert_eq!(t, "{ next?: unknown }");
        assert_eq!(ts(json!({"$ref": "http://example.com/x"})), "unknown");
    }
}
