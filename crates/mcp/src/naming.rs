//! Names of MCP tools and namespaces as codemode registers them.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

/// Longest registered tool name; many model APIs refuse longer function names.
pub const MAX_TOOL_NAME: usize = 64;

/// Characters kept from a shortened name before the `_<hash>` suffix (64 = 55 + 1 + 8).
const KEPT_PREFIX: usize = 55;

/// Replaces every character outside `[A-Za-z0-9_]` with `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The server's own tool whose name sanitizes to `local`, the name codemode gives a tool it adds
/// for the server (`read-resource` for `read_resource`). Such a tool may hold the registered name
/// `mcp__<server>__<local>`, so codemode adds no tool of that name: a request meant for it would
/// run the server's tool instead.
pub(crate) fn own_tool_claiming<'a>(
    tools: impl IntoIterator<Item = &'a str>,
    local: &str,
) -> Option<&'a str> {
    tools.into_iter().find(|t| sanitize(t) == local)
}

/// The namespace of a server's tools: `mcp__<server>` (sanitized).
pub fn mcp_namespace(server: &str) -> String {
    format!("mcp__{}", sanitize(server))
}

/// The registered name of an MCP tool: `mcp__<server>__<tool>`, sanitized.
///
/// A name longer than [`MAX_TOOL_NAME`] or already in `taken` is cut to 55 characters and given a
/// `_` plus 8 hex digits of SHA-256(`server` NUL `tool`), so that it stays stable across runs and
/// unique even when two raw names sanitize to the same string.
pub fn mcp_tool_name(server: &str, tool: &str, taken: &HashSet<String>) -> String {
    let plain = format!("mcp__{}__{}", sanitize(server), sanitize(tool));
    if plain.len() <= MAX_TOOL_NAME && !taken.contains(&plain) {
        return plain;
    }
    hashed_name(&plain, server, tool, taken)
}

/// `plain` cut short with a hash of the raw names, never one of the `taken` names.
///
/// Eight hex digits are 32 bits, few enough that a server could search for a tool name whose
/// shortened name equals another tool's: then the digest grows (the prefix shrinks) until the
/// name is free, so a tool never takes a name another already holds.
fn hashed_name(plain: &str, server: &str, tool: &str, taken: &HashSet<String>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(server.as_bytes());
    hasher.update([0u8]);
    hasher.update(tool.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let mut candidate = String::new();
    for digits in [8, 16, 32, 48] {
        // `plain` is ASCII after sanitizing, so byte slicing is safe.
        let keep = plain.len().min(MAX_TOOL_NAME - 1 - digits).min(KEPT_PREFIX);
        candidate = format!("{}_{}", &plain[..keep], &digest[..digits]);
        if !taken.contains(&candidate) {
            break;
        }
    }
    candidate
}

/// Names for all tools of one server, given the names other servers already hold; `None` for a
/// tool left out.
///
/// Tools of the same server whose names sanitize to the same string (`delete-all`, `delete.all`)
/// are all left out. Naming them apart would rename a tool whenever the server lists a
/// look-alike beside it, and a settings rule or policy written on the old name (disabling
/// `mcp__db__delete_all`, say) would then match nothing while the tool stayed callable.
pub fn name_server_tools(
    server: &str,
    tools: &[String],
    taken: &HashSet<String>,
) -> Vec<Option<String>> {
    let plain: Vec<String> = tools
        .iter()
        .map(|t| format!("mcp__{}__{}", sanitize(server), sanitize(t)))
        .collect();
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for p in &plain {
        *counts.entry(p.as_str()).or_default() += 1;
    }
    let mut used = taken.clone();
    let mut out = Vec::with_capacity(tools.len());
    for (tool, p) in tools.iter().zip(&plain) {
        if counts.get(p.as_str()).copied().unwrap_or(0) > 1 {
            out.push(None);
            continue;
        }
        let name = if p.len() > MAX_TOOL_NAME || used.contains(p) {
            hashed_name(p, server, tool, &used)
        } else {
            p.clone()
        };
        used.insert(name.clone());
        out.push(Some(name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_hex8_suffix(name: &str) -> bool {
        let (_, tail) = name.rsplit_once('_').unwrap();
        tail.len() == 8 && tail.chars().all(|c| c.is_ascii_hexdigit())
    }

    #[test]
    fn plain_names() {
        let none = HashSet::new();
        assert_eq!(mcp_tool_name("docs", "search", &none), "mcp__docs__search");
        assert_eq!(
            mcp_tool_name("my-server", "read-file", &none),
            "mcp__my_server__read_file"
        );
        assert_eq!(mcp_namespace("dev-radius"), "mcp__dev_radius");
    }

    #[test]
    fn long_names_are_cut_with_a_hash() {
        let tool = "x".repeat(80);
        let name = mcp_tool_name("s", &tool, &HashSet::new());
        assert_eq!(name.len(), 64);
        assert!(is_hex8_suffix(&name), "{name}");
        assert_eq!(name, mcp_tool_name("s", &tool, &HashSet::new()), "stable");
    }

    #[test]
    fn taken_names_get_a_hash() {
        let taken: HashSet<String> = ["mcp__s__a_b".to_string()].into();
        let name = mcp_tool_name("s", "a-b", &taken);
        assert!(name.starts_with("mcp__s__a_b_"), "{name}");
        assert!(is_hex8_suffix(&name));
    }

    /// A tool whose shortened name was chosen to equal one already taken gets a longer digest,
    /// not the taken name.
    #[test]
    fn a_shortened_name_never_takes_a_name_already_held() {
        let tool = "y".repeat(80);
        let first = mcp_tool_name("s", &tool, &HashSet::new());
        let taken: HashSet<String> = [first.clone()].into();
        let second = mcp_tool_name("s", &tool, &taken);
        assert_ne!(first, second);
        assert!(second.len() <= MAX_TOOL_NAME, "{second}");
        let (_, digest) = second.rsplit_once('_').unwrap();
        assert_eq!(digest.len(), 16, "{second}");
        // Held in the same listing: two tools of one server.
        let names = name_server_tools("s", std::slice::from_ref(&tool), &taken);
        assert_ne!(names[0].as_deref(), Some(first.as_str()));
    }

    #[test]
    fn colliding_tools_of_one_server_are_left_out() {
        let names = name_server_tools(
            "s",
            &["a-b".into(), "a.b".into(), "c".into()],
            &HashSet::new(),
        );
        assert_eq!(names, [None, None, Some("mcp__s__c".to_string())]);
        // The look-alike listed later takes its twin's name away, never renames it.
        let before = name_server_tools("s", &["a-b".into()], &HashSet::new());
        assert_eq!(before, [Some("mcp__s__a_b".to_string())]);
    }
}
