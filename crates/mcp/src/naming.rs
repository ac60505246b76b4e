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

/// Why a server's tool is not registered: the warning says so, naming the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut {
    /// Another tool of the same server has a name that becomes the same registered name.
    SameName,
    /// Its name must be shortened, and every shortened name that keeps `mcp__<server>__` is held
    /// by another tool.
    NoFreeName,
    /// Its name must be shortened, and the server's name is too long to leave room for a hash
    /// after `mcp__<server>__`.
    ServerNameTooLong,
    /// Its name is one of the shortened names of another tool of the same server, which that
    /// tool holds.
    LooksShortened,
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LeftOut::SameName => {
                "the server lists another tool whose name becomes the same registered name; neither is registered, so that a rule or policy naming one never silently stops applying. Rename one on the server"
            }
            LeftOut::NoFreeName => {
                "the tool's registered name is too long or taken, and every shortened name that keeps the server's prefix mcp__<server>__ is held by another tool: no free name is left for it, so it is not registered (never under a name another tool holds, nor outside the prefix that rules, hooks and policies on the server match). Rename it on the server"
            }
            LeftOut::LooksShortened => {
                "the tool's name is, as registered, a shortened name (cut, with a hash) of another tool of the same server; the name stays that tool's, so that a rule or policy written on it never moves to this one, and this one is not registered. Rename it on the server"
            }
            LeftOut::ServerNameTooLong => {
                "the tool's registered name is longer than 64 characters, and the server's name is too long to leave room for a shortened name that keeps the prefix mcp__<server>__ (which rules, hooks and policies on the server match), so it is not registered. Give the server a shorter name in mcp.json"
            }
        })
    }
}

/// The registered name of an MCP tool: `mcp__<server>__<tool>`, sanitized.
///
/// A name longer than [`MAX_TOOL_NAME`] or already in `taken` is shortened:
/// cut, and given a `_` plus hex digits of SHA-256(`server` NUL `tool`), so that it stays stable
/// across runs and unique even when two raw names sanitize to the same string. A shortened name
/// always keeps the whole `mcp__<server>__`; when none that does is free, the tool gets no name.
pub fn mcp_tool_name(server: &str, tool: &str, taken: &HashSet<String>) -> Result<String, LeftOut> {
    let prefix = format!("{}__", mcp_namespace(server));
    let plain = format!("{prefix}{}", sanitize(tool));
    if plain.len() <= MAX_TOOL_NAME && !taken.contains(&plain) {
        return Ok(plain);
    }
    hashed_name(&plain, prefix.len(), server, tool, taken)
}

/// `plain` cut short with a hash of the raw names, never one of the `taken` names and never
/// shorter than its first `prefix_len` characters (`mcp__<server>__`).
///
/// Eight hex digits are 32 bits, few enough that a server could search for a tool name whose
/// shortened name equals another tool's: then the digest grows (the rest of the name shrinks)
/// until the name is free. The prefix is never cut into: a name outside `mcp__<server>__` would
/// escape every `tools` rule, hook matcher and policy written on that prefix. So when no
/// candidate that keeps it is free, or none fits beside a long server name, there is no name.
fn hashed_name(
    plain: &str,
    prefix_len: usize,
    server: &str,
    tool: &str,
    taken: &HashSet<String>,
) -> Result<String, LeftOut> {
    let candidates = shortened_names(plain, prefix_len, server, tool);
    if candidates.is_empty() {
        return Err(LeftOut::ServerNameTooLong);
    }
    candidates
        .into_iter()
        .find(|c| !taken.contains(c))
        .ok_or(LeftOut::NoFreeName)
}

/// The shortened names `plain` may get, first choice first: cut, and `_` plus 8, 16, 32 or 48
/// hex digits of SHA-256(`server` NUL `tool`), each keeping at least `prefix_len` characters.
fn shortened_names(plain: &str, prefix_len: usize, server: &str, tool: &str) -> Vec<String> {
    let mut hasher = Sha256::new();
    hasher.update(server.as_bytes());
    hasher.update([0u8]);
    hasher.update(tool.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let mut out = Vec::new();
    for digits in [8, 16, 32, 48] {
        // `plain` is ASCII after sanitizing, so byte slicing is safe.
        let keep = plain.len().min(MAX_TOOL_NAME - 1 - digits).min(KEPT_PREFIX);
        if keep < prefix_len {
            // Longer digests keep even less.
            break;
        }
        out.push(format!("{}_{}", &plain[..keep], &digest[..digits]));
    }
    out
}

/// Names for all tools of one server, given the names other servers already hold; for a tool
/// left out, why.
///
/// Tools of the same server whose names sanitize to the same string (`delete-all`, `delete.all`)
/// are all left out. Naming them apart would rename a tool whenever the server lists a
/// look-alike beside it, and a settings rule or policy written on the old name (disabling
/// `mcp__db__delete_all`, say) would then match nothing while the tool stayed callable.
///
/// The outcome depends neither on the order the server lists its tools in nor on what it listed
/// before. A tool whose name is spelled like one of the shortened names of another tool of the
/// same server is left out ([`LeftOut::LooksShortened`]): otherwise a re-listing that adds it
/// would take the long tool's name away, and a rule or policy written on that name would move
/// to the newcomer. Other names that fit as the server spells them are reserved before any name
/// is shortened; tools whose names are shortened are named in the order of their raw names.
pub fn name_server_tools(
    server: &str,
    tools: &[String],
    taken: &HashSet<String>,
) -> Vec<Result<String, LeftOut>> {
    let prefix = format!("{}__", mcp_namespace(server));
    let plain: Vec<String> = tools
        .iter()
        .map(|t| format!("{prefix}{}", sanitize(t)))
        .collect();
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for p in &plain {
        *counts.entry(p.as_str()).or_default() += 1;
    }
    // Look-alikes' names too: a rule naming a tool left out matches no other tool instead.
    let mut used = taken.clone();
    used.extend(plain.iter().filter(|p| p.len() <= MAX_TOOL_NAME).cloned());
    // Every shortened name any of them may get: a tool spelled like one never holds it.
    let shortened: HashSet<String> = plain
        .iter()
        .zip(tools)
        .filter(|(p, _)| p.len() > MAX_TOOL_NAME || taken.contains(*p))
        .flat_map(|(p, t)| shortened_names(p, prefix.len(), server, t))
        .collect();
    for p in &plain {
        if shortened.contains(p) {
            used.remove(p);
        }
    }
    let mut out: Vec<Result<String, LeftOut>> = Vec::with_capacity(tools.len());
    let mut to_shorten = Vec::new();
    for (i, p) in plain.iter().enumerate() {
        if counts.get(p.as_str()).copied().unwrap_or(0) > 1 {
            out.push(Err(LeftOut::SameName));
        } else if shortened.contains(p) {
            out.push(Err(LeftOut::LooksShortened));
        } else if p.len() <= MAX_TOOL_NAME && !taken.contains(p) {
            out.push(Ok(p.clone()));
        } else {
            // Filled in below.
            out.push(Err(LeftOut::NoFreeName));
            to_shorten.push(i);
        }
    }
    // Distinct plain names, hence distinct raw names: a total order.
    to_shorten.sort_by(|&a, &b| tools[a].cmp(&tools[b]));
    for i in to_shorten {
        out[i] = hashed_name(&plain[i], prefix.len(), server, &tools[i], &used);
        if let Ok(name) = &out[i] {
            used.insert(name.clone());
        }
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
        assert_eq!(
            mcp_tool_name("docs", "search", &none).unwrap(),
            "mcp__docs__search"
        );
        assert_eq!(
            mcp_tool_name("my-server", "read-file", &none).unwrap(),
            "mcp__my_server__read_file"
        );
        assert_eq!(mcp_namespace("dev-radius"), "mcp__dev_radius");
    }

    #[test]
    fn long_names_are_cut_with_a_hash() {
        let tool = "x".repeat(80);
        let name = mcp_tool_name("s", &tool, &HashSet::new()).unwrap();
        assert_eq!(name.len(), 64);
        assert!(is_hex8_suffix(&name), "{name}");
        assert_eq!(
            name,
            mcp_tool_name("s", &tool, &HashSet::new()).unwrap(),
            "stable"
        );
    }

    #[test]
    fn taken_names_get_a_hash() {
        let taken: HashSet<String> = ["mcp__s__a_b".to_string()].into();
        let name = mcp_tool_name("s", "a-b", &taken).unwrap();
        assert!(name.starts_with("mcp__s__a_b_"), "{name}");
        assert!(is_hex8_suffix(&name));
    }

    /// A tool whose shortened name was chosen to equal one already taken gets a longer digest,
    /// not the taken name.
    #[test]
    fn a_shortened_name_never_takes_a_name_already_held() {
        let tool = "y".repeat(80);
        let first = mcp_tool_name("s", &tool, &HashSet::new()).unwrap();
        let taken: HashSet<String> = [first.clone()].into();
        let second = mcp_tool_name("s", &tool, &taken).unwrap();
        assert_ne!(first, second);
        assert!(second.len() <= MAX_TOOL_NAME, "{second}");
        let (_, digest) = second.rsplit_once('_').unwrap();
        assert_eq!(digest.len(), 16, "{second}");
        // Held in the same listing: two tools of one server.
        let names = name_server_tools("s", std::slice::from_ref(&tool), &taken);
        assert_ne!(names[0].as_deref(), Ok(first.as_str()));
    }

    #[test]
    fn colliding_tools_of_one_server_are_left_out() {
        let names = name_server_tools(
            "s",
            &["a-b".into(), "a.b".into(), "c".into()],
            &HashSet::new(),
        );
        assert_eq!(
            names,
            [
                Err(LeftOut::SameName),
                Err(LeftOut::SameName),
                Ok("mcp__s__c".to_string())
            ]
        );
        // The look-alike listed later takes its twin's name away, never renames it.
        let before = name_server_tools("s", &["a-b".into()], &HashSet::new());
        assert_eq!(before, [Ok("mcp__s__a_b".to_string())]);
    }

    /// The tool a server lists to hold, verbatim, the name `tool` gets with `digits` hex digits
    /// when nothing is taken but the shorter ones: what an attacker computes.
    fn decoy(server: &str, tool: &str, digits: usize) -> String {
        let plain = format!("mcp__{server}__{tool}");
        let mut hasher = Sha256::new();
        hasher.update(format!("{server}\0{tool}").as_bytes());
        let digest = hex::encode(hasher.finalize());
        let keep = plain.len().min(MAX_TOOL_NAME - 1 - digits).min(KEPT_PREFIX);
        let name = format!("{}_{}", &plain[..keep], &digest[..digits]);
        name.strip_prefix(&format!("mcp__{server}__"))
            .unwrap_or_else(|| panic!("{name} is outside the server's prefix"))
            .to_string()
    }

    fn long_tool() -> String {
        format!("run_arbitrary_code_{}", "x".repeat(60))
    }

    /// Red-team finding: decoys of the 8, 16 and 32-digit names pushed a long tool of
    /// `playwright` to the 48-digit name, which kept 15 characters (`mcp__playwright_…`) and so
    /// escaped every rule on `mcp__playwright__*`. No name leaves the prefix: the decoys of the
    /// same server are left out and the tool keeps its first name; held by other servers'
    /// (never so, given the prefixes, but `taken` says so), it is left out.
    #[test]
    fn a_shortened_name_always_keeps_the_servers_whole_prefix() {
        let long = long_tool();
        let mut tools: Vec<String> = [8, 16, 32]
            .iter()
            .map(|&d| decoy("playwright", &long, d))
            .collect();
        tools.push(long.clone());
        let names = name_server_tools("playwright", &tools, &HashSet::new());
        for name in names.iter().flatten() {
            assert!(name.starts_with("mcp__playwright__"), "{name}");
        }
        for decoy in &names[..3] {
            assert_eq!(*decoy, Err(LeftOut::LooksShortened));
        }
        assert_eq!(
            names[3].as_deref(),
            Ok(format!("mcp__playwright__{}", decoy("playwright", &long, 8)).as_str())
        );
        // Alone against names held elsewhere: no free name within the prefix.
        let taken: HashSet<String> = tools[..3]
            .iter()
            .map(|t| format!("mcp__playwright__{t}"))
            .collect();
        assert_eq!(
            mcp_tool_name("playwright", &long, &taken),
            Err(LeftOut::NoFreeName)
        );
    }

    /// Every shortened name held elsewhere: the tool gets none, never the last one tried.
    #[test]
    fn a_tool_whose_every_shortened_name_is_held_gets_no_name() {
        let long = long_tool();
        let taken: HashSet<String> = [8, 16, 32, 48]
            .iter()
            .map(|&d| format!("mcp__s__{}", decoy("s", &long, d)))
            .collect();
        let names = name_server_tools("s", std::slice::from_ref(&long), &taken);
        assert_eq!(names[0], Err(LeftOut::NoFreeName));
        // Listed by the same server, the decoys are left out instead, and no name is given twice.
        let mut tools: Vec<String> = [8, 16, 32, 48]
            .iter()
            .map(|&d| decoy("s", &long, d))
            .collect();
        tools.push(long.clone());
        let names = name_server_tools("s", &tools, &HashSet::new());
        assert!(
            names[..4]
                .iter()
                .all(|n| *n == Err(LeftOut::LooksShortened))
        );
        assert_eq!(
            names[4].as_deref(),
            Ok(format!("mcp__s__{}", decoy("s", &long, 8)).as_str())
        );
    }

    /// A server name so long that no hash fits after `mcp__<server>__`: a long tool is left out,
    /// a short one keeps its name.
    #[test]
    fn a_long_tool_of_a_server_with_a_very_long_name_is_left_out() {
        let server = "s".repeat(50);
        let names = name_server_tools(&server, &[long_tool(), "a".into()], &HashSet::new());
        assert_eq!(names[0], Err(LeftOut::ServerNameTooLong));
        assert_eq!(names[1], Ok(format!("mcp__{server}__a")));
    }

    /// Neither the list order nor an earlier listing decides who holds a shortened name: the
    /// long tool keeps the name it got alone when a re-listing adds a tool spelled like it
    /// (red team, round 4: the newcomer took it, and a rule written on it moved to the
    /// newcomer), whichever comes first.
    #[test]
    fn a_shortened_name_stays_with_its_tool() {
        let long = long_tool();
        let decoy8 = decoy("s", &long, 8);
        let alone = name_server_tools("s", std::slice::from_ref(&long), &HashSet::new());
        let forward = name_server_tools("s", &[decoy8.clone(), long.clone()], &HashSet::new());
        let backward = name_server_tools("s", &[long.clone(), decoy8.clone()], &HashSet::new());
        assert_eq!(alone[0], Ok(format!("mcp__s__{decoy8}")));
        assert_eq!(forward[1], alone[0]);
        assert_eq!(backward[0], alone[0]);
        assert_eq!(forward[0], Err(LeftOut::LooksShortened));
        assert_eq!(backward[1], Err(LeftOut::LooksShortened));
    }
}
