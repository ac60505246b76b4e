//! Object types that several listed tools share, declared once under a name.
//!
//! MCP servers repeat shapes: the memory server's entity appears in five of its nine tools, in
//! inputs and results. Printing the shape once (`type Entity = { … }`) and its name everywhere
//! else says the same in fewer tokens. Only nested objects are named, after the property that
//! holds them (`entities: Entity[]`), so a name always says what the thing is.

use std::collections::{BTreeMap, HashMap};

use codemode_spec::to_identifier;

use crate::render::{Listing, print_shared, shape_key};
use crate::schema::{Object, Ty};

/// Names a shared type may not take: the description's own and TypeScript's built-in ones.
const RESERVED: &[&str] = &[
    "McpResult",
    "Block",
    "Ns",
    "Array",
    "Boolean",
    "Date",
    "Error",
    "Function",
    "Map",
    "Number",
    "Object",
    "Promise",
    "Record",
    "Set",
    "String",
    "Symbol",
];

/// A shape printed in fewer characters than this is cheaper written out than named.
const MIN_SHAPE_CHARS: usize = 40;

#[derive(Debug, Default)]
pub(crate) struct SharedTypes {
    /// Shape key → name.
    names: HashMap<String, String>,
    /// (name, the richest occurrence: the one printed with the most comments and tags).
    declared: Vec<(String, Object)>,
}

struct Occurrences {
    count: usize,
    /// Property names that held this shape, with how often.
    holders: BTreeMap<String, usize>,
    richest: Object,
    richness: usize,
}

impl SharedTypes {
    /// Finds the shapes that occur at least twice among `trees` and are worth a name.
    pub(crate) fn find(trees: &[&Ty]) -> SharedTypes {
        let mut seen: BTreeMap<String, Occurrences> = BTreeMap::new();
        for tree in trees {
            visit(tree, None, &mut seen);
        }
        let mut taken: Vec<String> = RESERVED.iter().map(|s| s.to_string()).collect();
        let mut shared = SharedTypes::default();
        for (key, found) in seen {
            if found.count < 2 || key.len() < MIN_SHAPE_CHARS {
                continue;
            }
            let Some(holder) = found
                .holders
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(h, _)| h.as_str())
            else {
                continue;
            };
            let base = type_name(holder);
            let mut name = base.clone();
            let mut n = 2;
            while taken.contains(&name) {
                name = format!("{base}{n}");
                n += 1;
            }
            taken.push(name.clone());
            shared.names.insert(key, name.clone());
            shared.declared.push((name, found.richest));
        }
        shared.declared.sort_by(|a, b| a.0.cmp(&b.0));
        shared
    }

    pub(crate) fn name_of(&self, shape_key: &str) -> Option<&str> {
        self.names.get(shape_key).map(String::as_str)
    }

    /// The names declared.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.declared.iter().map(|(name, _)| name.as_str())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.declared.is_empty()
    }

    /// `type Name = { … };` lines, sorted by name. Shared types inside them are named too.
    pub(crate) fn declarations(&self, listing: &Listing) -> String {
        self.declared
            .iter()
            .map(|(name, object)| print_shared(name, object, listing))
            .collect()
    }
}

fn visit(ty: &Ty, holder: Option<&str>, seen: &mut BTreeMap<String, Occurrences>) {
    match ty {
        Ty::Object(object) => {
            if let Some(holder) = holder
                && !object.props.is_empty()
            {
                record(object, holder, seen);
            }
            for prop in &object.props {
                visit(&prop.ty, Some(prop.key.trim_matches('"')), seen);
            }
            if let Some(index) = &object.index {
                visit(index, holder, seen);
            }
        }
        Ty::Array(item) => visit(item, holder, seen),
        Ty::Union(members) | Ty::Intersection(members) => {
            for m in members {
                visit(m, holder, seen);
            }
        }
        Ty::Tuple { items, rest } => {
            for item in items {
                visit(item, holder, seen);
            }
            if let Some(rest) = rest {
                visit(rest, holder, seen);
            }
        }
        Ty::Unknown | Ty::Never | Ty::Atom(_) => {}
    }
}

fn record(object: &Object, holder: &str, seen: &mut BTreeMap<String, Occurrences>) {
    let key = shape_key(object);
    let richness: usize = object
        .props
        .iter()
        .map(|p| {
            p.doc.iter().map(String::len).sum::<usize>()
                + p.tags.iter().map(String::len).sum::<usize>()
        })
        .sum();
    let entry = seen.entry(key).or_insert_with(|| Occurrences {
        count: 0,
        holders: BTreeMap::new(),
        richest: object.clone(),
        richness,
    });
    entry.count += 1;
    *entry.holders.entry(holder.to_string()).or_default() += 1;
    if richness > entry.richness {
        entry.richest = object.clone();
        entry.richness = richness;
    }
}

/// `entities` → `Entity`, `file_info` → `FileInfo`, `edits` → `Edit`.
fn type_name(holder: &str) -> String {
    let identifier = to_identifier(holder);
    let singular = crate::search::singular(identifier.to_lowercase());
    let mut out = String::new();
    let mut upper = true;
    // Keep the holder's own capitals (camelCase) where the singular form kept its letters.
    let original: Vec<char> = identifier.chars().collect();
    for (i, ch) in singular.chars().enumerate() {
        if ch == '_' || ch == '$' {
            upper = true;
            continue;
        }
        let source = original.get(i).copied().unwrap_or(ch);
        if upper {
            out.extend(ch.to_uppercase());
            upper = false;
        } else if source.is_uppercase() {
            out.push(source);
        } else {
            out.push(ch);
        }
    }
    if out.is_empty() || !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "Type");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_holding_property() {
        assert_eq!(type_name("entities"), "Entity");
        assert_eq!(type_name("relations"), "Relation");
        assert_eq!(type_name("file_info"), "FileInfo");
        assert_eq!(type_name("addedObservations"), "AddedObservation");
        assert_eq!(type_name("edits"), "Edit");
        assert_eq!(type_name("2nd"), "Nd");
    }
}
