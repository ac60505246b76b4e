//! Checks on what a script is given, made before the VM is touched.

use std::collections::{BTreeSet, HashMap};

use crate::host::ToolEntry;

const RESERVED: &[&str] = &[
    "tools",
    "ALL_TOOLS",
    "console",
    "text",
    "image",
    "textOf",
    "exit",
    "globalThis",
    "store",
    "load",
    "atob",
    "btoa",
];

/// Two tools must not map to the same script identifier: one would silently shadow the other.
pub(crate) fn check_tools(tools: &[ToolEntry]) -> Result<(), String> {
    let mut by_id: HashMap<String, &str> = HashMap::new();
    let mut raw: HashMap<&str, ()> = HashMap::new();
    for t in tools {
        if raw.insert(t.name.as_str(), ()).is_some() {
            return Err(format!(
                "Tool \"{}\" is given twice. Give each tool once.",
                t.name
            ));
        }
        let id = codemode_spec::to_identifier(&t.name);
        if let Some(other) = by_id.insert(id.clone(), t.name.as_str()) {
            return Err(format!(
                "Tools \"{other}\" and \"{}\" both become tools.{id} in scripts. Rename one of them so their identifiers differ.",
                t.name
            ));
        }
    }
    Ok(())
}

fn is_js_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// Global names: `name` or `namespace.member`, not reserved, not given twice, and a namespace
/// may not also be a plain global.
pub(crate) fn check_globals(globals: &[String]) -> Result<(), String> {
    let mut plain = BTreeSet::new();
    let mut spaces = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for g in globals {
        let parts: Vec<&str> = g.split('.').collect();
        let valid = parts.len() <= 2 && parts.iter().all(|p| is_js_name(p));
        if !valid || RESERVED.contains(&parts[0]) {
            return Err(format!(
                "Invalid global name \"{g}\": use a JavaScript identifier or namespace.member, not one of {}.",
                RESERVED.join(", ")
            ));
        }
        if !seen.insert(g.as_str()) {
            return Err(format!("Global \"{g}\" is given twice."));
        }
        if parts.len() == 2 {
            spaces.insert(parts[0]);
        } else {
            plain.insert(parts[0]);
        }
    }
    if let Some(both) = plain.intersection(&spaces).next() {
        return Err(format!(
            "Global \"{both}\" conflicts with the namespace \"{both}\" of other globals."
        ));
    }
    Ok(())
}
