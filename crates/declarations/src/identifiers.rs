//! Tools whose names map to the same script identifier (`my-tool` and `my_tool`).

use std::collections::BTreeMap;

use codemode_spec::ToolSpec;

/// Two or more tools share one `tools.<identifier>`. Neither may silently shadow the other, so the
/// declarations address each by its quoted raw name and say so, and the runtime can refuse or warn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifierCollision {
    pub identifier: String,
    /// The raw names, sorted.
    pub names: Vec<String>,
}

/// Every identifier shared by more than one distinct raw name, sorted by identifier.
pub fn identifier_collisions(tools: &[ToolSpec]) -> Vec<IdentifierCollision> {
    let mut by_identifier: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for tool in tools {
        let names = by_identifier.entry(tool.identifier()).or_default();
        if !names.contains(&tool.name) {
            names.push(tool.name.clone());
        }
    }
    by_identifier
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(identifier, mut names)| {
            names.sort();
            IdentifierCollision { identifier, names }
        })
        .collect()
}

/// The member key a tool gets in declarations: its identifier, or its quoted raw name when the
/// identifier is shared.
pub(crate) fn member_key(tool: &ToolSpec, collisions: &[IdentifierCollision]) -> String {
    let identifier = tool.identifier();
    if collisions.iter().any(|c| c.identifier == identifier) {
        crate::render::quoted_key(&tool.name)
    } else {
        identifier
    }
}

/// The comment line that explains a shared identifier, or `None` when the tool's is its own.
pub(crate) fn collision_note(
    tool: &ToolSpec,
    collisions: &[IdentifierCollision],
) -> Option<String> {
    let identifier = tool.identifier();
    let collision = collisions.iter().find(|c| c.identifier == identifier)?;
    Some(format!(
        "`tools.{identifier}` is ambiguous ({}); call this one as `tools[{}]`",
        collision.names.join(", "),
        crate::text::json_string(&tool.name)
    ))
}
