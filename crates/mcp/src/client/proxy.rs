//! Resources and prompts of every server, merged for `codemode serve` to offer in mode `on`.
//!
//! Resources keep their URIs (a client shows them to the user and hands them back); a read is
//! routed to the server that listed the URI, or whose template's fixed prefix it starts with.
//! Prompt names get the server's namespace, as tools do (`mcp__<server>__<prompt>`), because two
//! servers may both have a prompt called `summarize`.

use rmcp::model::{Prompt, ReadResourceResult, Resource, ResourceTemplate};
use tokio_util::sync::CancellationToken;

use super::hub::McpHub;
use crate::naming::{mcp_namespace, own_tool_claiming};

/// Why a proxied resource or prompt request failed; the message is for the person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

impl McpHub {
    /// Whether any server offers resources (the capability to declare).
    pub fn offers_resources(&self) -> bool {
        self.upstreams()
            .iter()
            .any(|u| u.catalog().resources.is_some())
    }

    /// Whether any server offers prompts.
    pub fn offers_prompts(&self) -> bool {
        self.upstreams()
            .iter()
            .any(|u| u.catalog().prompts.is_some())
    }

    /// Every connected server's resources, as they listed them.
    pub fn resources(&self) -> Vec<Resource> {
        self.resources_where(|_| true)
    }

    /// The resources of the servers whose `list_resources` tool (its registered name is passed)
    /// `listed` accepts: a client's listing shows no more than a script's could.
    pub fn resources_where(&self, listed: impl Fn(&str) -> bool) -> Vec<Resource> {
        self.upstreams()
            .iter()
            .filter(|u| listed(&list_tool(u.name())))
            .flat_map(|u| {
                u.catalog()
                    .resources
                    .map(|r| r.resources)
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Every connected server's resource templates.
    pub fn resource_templates(&self) -> Vec<ResourceTemplate> {
        self.resource_templates_where(|_| true)
    }

    /// The resource templates of the servers whose `list_resources` tool `listed` accepts.
    pub fn resource_templates_where(&self, listed: impl Fn(&str) -> bool) -> Vec<ResourceTemplate> {
        self.upstreams()
            .iter()
            .filter(|u| listed(&list_tool(u.name())))
            .flat_map(|u| {
                u.catalog()
                    .resources
                    .map(|r| r.templates)
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Reads a resource from the server that offers its URI.
    pub async fn read_resource(
        &self,
        uri: &str,
        cancel: &CancellationToken,
    ) -> Result<ReadResourceResult, ProxyError> {
        let index = self.resource_upstream(uri)?;
        self.upstreams()[index]
            .read_resource(uri, cancel)
            .await
            .map_err(|e| ProxyError::Failed(e.message))
    }

    /// The registered name of the gated tool that reads `uri` from the server offering it
    /// (`mcp__<server>__read_resource`), so a client's own resource reads pass the gate too.
    pub fn resource_read_tool(&self, uri: &str) -> Result<String, ProxyError> {
        let upstream = &self.upstreams()[self.resource_upstream(uri)?];
        let catalog = upstream.catalog();
        if let Some(tool) =
            own_tool_claiming(catalog.tools.iter().map(|t| t.name()), "read_resource")
        {
            return Err(ProxyError::Failed(format!(
                "MCP server {} has a tool of its own named {tool:?}, which takes the name of \
                 codemode's read_resource, so its resources have no gated reader here; rename \
                 that tool on the server to read its resources through codemode",
                upstream.name()
            )));
        }
        Ok(format!("{}__read_resource", mcp_namespace(upstream.name())))
    }

    fn resource_upstream(&self, uri: &str) -> Result<usize, ProxyError> {
        let mut best: Option<(usize, usize)> = None;
        for (i, u) in self.upstreams().iter().enumerate() {
            let Some(listed) = u.catalog().resources else {
                continue;
            };
            if listed.resources.iter().any(|r| r.uri == uri) {
                best = Some((usize::MAX, i));
                break;
            }
            for t in &listed.templates {
                let prefix = t.uri_template.split('{').next().unwrap_or("");
                if !prefix.is_empty()
                    && uri.starts_with(prefix)
                    && best.is_none_or(|(len, _)| prefix.len() > len)
                {
                    best = Some((prefix.len(), i));
                }
            }
        }
        let offering: Vec<usize> = (0..self.upstreams().len())
            .filter(|i| self.upstreams()[*i].catalog().resources.is_some())
            .collect();
        let index = match (best, offering.as_slice()) {
            (Some((_, i)), _) => i,
            (None, [only]) => *only,
            _ => {
                return Err(ProxyError::NotFound(format!(
                    "no MCP server lists the resource {uri}"
                )));
            }
        };
        Ok(index)
    }

    /// Every connected server's prompts, named `mcp__<server>__<prompt>`.
    pub fn prompts(&self) -> Vec<Prompt> {
        self.prompts_where(|_| true)
    }

    /// The prompts of the servers whose `get_prompt` tool (its registered name is passed)
    /// `listed` accepts: a client's listing shows no more than it could get.
    pub fn prompts_where(&self, listed: impl Fn(&str) -> bool) -> Vec<Prompt> {
        let mut out = Vec::new();
        for u in self.upstreams() {
            if !listed(&format!("{}__get_prompt", mcp_namespace(u.name()))) {
                continue;
            }
            for mut p in u.catalog().prompts.unwrap_or_default() {
                p.name = format!("{}__{}", mcp_namespace(u.name()), p.name);
                out.push(p);
            }
        }
        out
    }

    /// The gated tool that gets prompt `name` (as [`McpHub::prompts`] named it) and the prompt's
    /// name on its server, so a client's own `prompts/get` passes the gate too.
    pub fn prompt_get_tool(&self, name: &str) -> Result<(String, String), ProxyError> {
        for u in self.upstreams() {
            let namespace = mcp_namespace(u.name());
            let Some(local) = name.strip_prefix(&format!("{namespace}__")) else {
                continue;
            };
            let catalog = u.catalog();
            if !catalog
                .prompts
                .unwrap_or_default()
                .iter()
                .any(|p| p.name == local)
            {
                continue;
            }
            if let Some(tool) = own_tool_claiming(
                catalog.tools.iter().map(|t| t.name()),
                super::prompts::PROMPT_TOOL,
            ) {
                return Err(ProxyError::Failed(format!(
                    "MCP server {} has a tool of its own named {tool:?}, which takes the name of \
                     codemode's get_prompt, so its prompts have no gated reader here; rename that \
                     tool on the server to get its prompts through codemode",
                    u.name()
                )));
            }
            return Ok((
                format!("{namespace}__{}", super::prompts::PROMPT_TOOL),
                local.to_string(),
            ));
        }
        Err(ProxyError::NotFound(format!(
            "no MCP server has the prompt {name}"
        )))
    }
}

/// The registered name of a server's resource-listing tool.
fn list_tool(server: &str) -> String {
    format!("{}__list_resources", crate::naming::mcp_namespace(server))
}
