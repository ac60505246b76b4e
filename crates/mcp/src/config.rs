//! The `mcpServers` configuration: parsing, the user/project merge and the narrowing rule.
//!
//! The format is the one users already have for other MCP clients (`{"mcpServers": {...}}`), plus
//! codemode's keys `enabled`, `exposure`, `toolExposure`, `timeout`, `description` and the
//! top-level `autoEnableCodemode`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use codemode_spec::Exposure;
use serde_json::{Map, Value};

use crate::McpError;
use crate::exposure::{ExposureRule, ExposureRules, narrower, parse_exposure};

/// How codemode reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTransport {
    /// A local process speaking MCP over stdin/stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Values may hold `${VAR}`, expanded when the server is started.
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        url: String,
        /// Values may hold `${VAR}`, expanded when the server is connected.
        headers: BTreeMap<String, String>,
    },
}

/// One configured server after merging.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: ServerTransport,
    pub enabled: bool,
    /// `exposure` and `toolExposure` from the file that defined the server (or a trusted override).
    pub exposure: ExposureRules,
    /// Limits an untrusted project set: a tool's exposure is never more visible than this.
    pub ceiling: Option<ExposureRules>,
    /// Per-request timeout for this server, overriding the hub's default.
    pub timeout: Option<Duration>,
    /// One sentence saying what the server is for, shown with its namespace.
    pub description: Option<String>,
    /// The file (or label) that defined the server.
    pub source: String,
}

impl ServerConfig {
    /// The exposure a tool of this server gets, after any untrusted project's limits.
    pub fn exposure_for(&self, tool: &str) -> Exposure {
        let own = self.exposure.lookup(tool);
        match &self.ceiling {
            Some(ceiling) => narrower(own, ceiling.lookup(tool)),
            None => own,
        }
    }

    /// Every exposure a tool of this server can end up with.
    fn possible_exposures(&self) -> Vec<Exposure> {
        let mut out: Vec<Exposure> = self.exposure.possible().collect();
        if let Some(ceiling) = &self.ceiling {
            out = out
                .into_iter()
                .map(|e| narrower(e, ceiling.default))
                .collect();
        }
        out
    }
}

/// The merged MCP configuration.
#[derive(Debug, Clone, Default)]
pub struct McpConfig {
    servers: Vec<ServerConfig>,
    auto_enable_codemode: bool,
}

/// Keys a project entry without `command`/`url`/`type` may set on a user server.
const OVERRIDE_KEYS: [&str; 3] = ["enabled", "exposure", "toolExposure"];

/// Every key a server entry may hold.
const KNOWN_KEYS: [&str; 14] = [
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "enabled",
    "exposure",
    "toolExposure",
    "timeout",
    "description",
    "oauth",
    "auth",
];

/// One entry as written in a file, before merging.
#[derive(Debug, Clone)]
enum Entry {
    /// A definition, plus its narrowing keys as written (for untrusted projects).
    Full(Box<ServerConfig>, Override, Vec<String>),
    Override(Override),
}

#[derive(Debug, Clone, Default)]
struct Override {
    enabled: Option<bool>,
    exposure: Option<Exposure>,
    tool_exposure: Vec<ExposureRule>,
}

struct ParsedFile {
    entries: Vec<(String, Entry)>,
    auto_enable_codemode: Option<bool>,
}

impl McpConfig {
    /// Loads the user file and, if given, the project file, and merges them.
    ///
    /// A missing file counts as empty. A file that is not JSON, or not an object, is an error
    /// (so a typo never silently drops every server); a bad server entry is skipped with a
    /// warning naming the file and the server. A trusted project may add, replace and override
    /// servers. An untrusted project may only narrow: disable servers, lower exposures, turn
    /// `autoEnableCodemode` off; every wider setting it holds is ignored with a warning naming
    /// the key.
    pub fn load(
        user_file: Option<&Path>,
        project_file: Option<&Path>,
        project_trusted: bool,
    ) -> Result<(McpConfig, Vec<String>), McpError> {
        let mut warnings = Vec::new();
        let mut config = McpConfig::default();
        if let Some(path) = user_file
            && let Some(v) = read_json(path)?
        {
            let source = path.display().to_string();
            let parsed = parse_file(&v, &source, false, &mut warnings)?;
            config.apply_user(parsed, &source, &mut warnings);
        }
        if let Some(path) = project_file
            && let Some(v) = read_json(path)?
        {
            let source = path.display().to_string();
            let parsed = parse_file(&v, &source, true, &mut warnings)?;
            if project_trusted {
                config.apply_trusted_project(parsed, &source, &mut warnings);
            } else {
                config.apply_untrusted_project(parsed, &source, &mut warnings);
            }
        }
        Ok((config, warnings))
    }

    /// Parses one configuration value strictly: any invalid entry is an error. For configuration
    /// handed over by an embedding program, where there is nobody to show warnings to.
    pub fn from_json(v: &Value, source: &str) -> Result<McpConfig, McpError> {
        let mut warnings = Vec::new();
        let parsed = parse_file(v, source, false, &mut warnings)?;
        if let Some(first) = warnings.into_iter().next() {
            return Err(McpError::config(source, first));
        }
        let mut config = McpConfig::default();
        let mut warnings = Vec::new();
        config.apply_user(parsed, source, &mut warnings);
        match warnings.into_iter().next() {
            Some(first) => Err(McpError::config(source, first)),
            None => Ok(config),
        }
    }

    /// All configured servers, enabled or not, in file order.
    pub fn servers(&self) -> &[ServerConfig] {
        &self.servers
    }

    pub fn server(&self, name: &str) -> Option<&ServerConfig> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// Whether the `codemode` tool should be switched on because of MCP servers
    /// (`autoEnableCodemode`, default false: activation is explicit).
    pub fn auto_enable_codemode(&self) -> bool {
        self.auto_enable_codemode && self.codemode_needed()
    }

    /// True when some enabled server has tools only a script can call (exposure `codemode` or
    /// `deferred`), so those tools are unreachable unless the `codemode` tool is on.
    pub fn codemode_needed(&self) -> bool {
        !self.script_only_servers().is_empty()
    }

    /// The single warning to show when tools are reachable by nothing: some server's tools can
    /// only be called from scripts but `codemode` is not enabled. `None` when all is well.
    pub fn reachability_warning(&self, codemode_enabled: bool) -> Option<String> {
        if codemode_enabled {
            return None;
        }
        let servers = self.script_only_servers();
        if servers.is_empty() {
            return None;
        }
        let why = if self.auto_enable_codemode {
            ""
        } else {
            " (autoEnableCodemode is false)"
        };
        Some(format!(
            "MCP tools of {} can only be called from codemode scripts, but the codemode tool is \
             not enabled{why}; they cannot be called. Enable codemode, set \
             \"autoEnableCodemode\": true, or give those tools exposure \"direct\".",
            servers
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    fn script_only_servers(&self) -> Vec<&str> {
        self.servers
            .iter()
            .filter(|s| s.enabled)
            .filter(|s| {
                s.possible_exposures()
                    .iter()
                    .any(|e| matches!(e, Exposure::Codemode | Exposure::Deferred))
            })
            .map(|s| s.name.as_str())
            .collect()
    }

    fn apply_user(&mut self, parsed: ParsedFile, source: &str, warnings: &mut Vec<String>) {
        if let Some(auto) = parsed.auto_enable_codemode {
            self.auto_enable_codemode = auto;
        }
        for (name, entry) in parsed.entries {
            match entry {
                Entry::Full(server, ..) => self.insert(*server, source, warnings),
                Entry::Override(_) => warnings.push(format!(
                    "{source}: server \"{name}\" needs \"command\" or \"url\""
                )),
            }
        }
    }

    fn apply_trusted_project(
        &mut self,
        parsed: ParsedFile,
        source: &str,
        warnings: &mut Vec<String>,
    ) {
        if let Some(auto) = parsed.auto_enable_codemode {
            self.auto_enable_codemode = auto;
        }
        for (name, entry) in parsed.entries {
            match entry {
                Entry::Full(server, ..) => {
                    self.servers.retain(|s| s.name != name);
                    self.insert(*server, source, warnings);
                }
                Entry::Override(o) => {
                    let Some(server) = self.servers.iter_mut().find(|s| s.name == name) else {
                        warnings.push(format!(
                            "{source}: server \"{name}\" needs \"command\" or \"url\", or a \
                             server of that name in the user config to override"
                        ));
                        continue;
                    };
                    if let Some(enabled) = o.enabled {
                        server.enabled = enabled;
                    }
                    if let Some(exposure) = o.exposure {
                        server.exposure.default = exposure;
                    }
                    if !o.tool_exposure.is_empty() {
                        // The project's patterns come first, so they win over the user's.
                        let mut rules = o.tool_exposure;
                        rules.append(&mut server.exposure.rules);
                        server.exposure.rules = rules;
                    }
                }
            }
        }
    }

    fn apply_untrusted_project(
        &mut self,
        parsed: ParsedFile,
        source: &str,
        warnings: &mut Vec<String>,
    ) {
        match parsed.auto_enable_codemode {
            Some(false) => self.auto_enable_codemode = false,
            Some(true) if !self.auto_enable_codemode => warnings.push(format!(
                "{source}: autoEnableCodemode ignored: an untrusted project may not turn it on"
            )),
            _ => {}
        }
        for (name, entry) in parsed.entries {
            let Some(server) = self.servers.iter_mut().find(|s| s.name == name) else {
                warnings.push(format!(
                    "{source}: mcpServers.{name} ignored: an untrusted project cannot add \
                     servers; trust the project or add the server to your user config"
                ));
                continue;
            };
            let o = match entry {
                Entry::Override(o) => o,
                Entry::Full(_, o, keys) => {
                    for key in keys {
                        warnings.push(format!(
                            "{source}: mcpServers.{name}.{key} ignored: an untrusted project \
                             cannot change how a server is started or reached"
                        ));
                    }
                    o
                }
            };
            narrow(server, o, source, warnings);
        }
    }

    fn insert(&mut self, server: ServerConfig, source: &str, warnings: &mut Vec<String>) {
        let key = server.name.replace('-', "_");
        if let Some(other) = self
            .servers
            .iter()
            .find(|s| s.name != server.name && s.name.replace('-', "_") == key)
        {
            warnings.push(format!(
                "{source}: server \"{}\" conflicts with \"{}\" (names that differ only in - and _ \
                 map to the same tool names); rename one",
                server.name, other.name
            ));
            return;
        }
        self.servers.retain(|s| s.name != server.name);
        self.servers.push(server);
    }
}

/// Applies an untrusted project's settings to `server`, keeping only what narrows.
fn narrow(server: &mut ServerConfig, o: Override, source: &str, warnings: &mut Vec<String>) {
    let name = server.name.clone();
    match o.enabled {
        Some(false) => server.enabled = false,
        Some(true) if !server.enabled => warnings.push(format!(
            "{source}: mcpServers.{name}.enabled ignored: an untrusted project may disable \
             servers, not enable them"
        )),
        _ => {}
    }
    let mut ceiling = server.ceiling.take().unwrap_or(ExposureRules {
        default: Exposure::Direct,
        rules: Vec::new(),
    });
    if let Some(exposure) = o.exposure {
        if exposure.visibility() > server.exposure.default.visibility() {
            warnings.push(format!(
                "{source}: mcpServers.{name}.exposure \"{}\" ignored: an untrusted project may \
                 only lower exposure (the user config says \"{}\")",
                exposure.as_str(),
                server.exposure.default.as_str()
            ));
        } else {
            ceiling.default = narrower(ceiling.default, exposure);
        }
    }
    let mut rules = Vec::new();
    for rule in o.tool_exposure {
        let current = server.exposure.lookup(&rule.pattern);
        if rule.exposure.visibility() > current.visibility() {
            warnings.push(format!(
                "{source}: mcpServers.{name}.toolExposure.\"{}\" \"{}\" ignored: an untrusted \
                 project may only lower exposure (currently \"{}\")",
                rule.pattern,
                rule.exposure.as_str(),
                current.as_str()
            ));
        } else {
            rules.push(rule);
        }
    }
    rules.append(&mut ceiling.rules);
    ceiling.rules = rules;
    server.ceiling = Some(ceiling);
}

fn read_json(path: &Path) -> Result<Option<Value>, McpError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(McpError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| McpError::Json {
            path: path.to_path_buf(),
            source,
        })
}

fn parse_file(
    v: &Value,
    source: &str,
    is_project: bool,
    warnings: &mut Vec<String>,
) -> Result<ParsedFile, McpError> {
    let root = v.as_object().ok_or_else(|| {
        McpError::config(
            source,
            "expected a JSON object with an \"mcpServers\" object",
        )
    })?;
    let auto_enable_codemode = match root.get("autoEnableCodemode") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(McpError::config(
                source,
                "autoEnableCodemode must be a boolean",
            ));
        }
    };
    let servers = match root.get("mcpServers") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(McpError::config(
                source,
                "\"mcpServers\" must be an object mapping server names to their settings",
            ));
        }
    };
    let mut entries = Vec::new();
    for (name, raw) in &servers {
        match parse_entry(name, raw, source, is_project, warnings) {
            Ok(entry) => entries.push((name.clone(), entry)),
            Err(message) => warnings.push(format!("{source}: server \"{name}\": {message}")),
        }
    }
    Ok(ParsedFile {
        entries,
        auto_enable_codemode,
    })
}

fn parse_entry(
    name: &str,
    raw: &Value,
    source: &str,
    is_project: bool,
    warnings: &mut Vec<String>,
) -> Result<Entry, String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err("the name may only hold letters, digits, - and _".into());
    }
    let obj = raw
        .as_object()
        .ok_or("the settings must be an object such as {\"command\": \"...\"}")?;
    for key in obj.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            warnings.push(format!(
                "{source}: mcpServers.{name}.{key} ignored: unknown key"
            ));
        }
    }
    if is_project && obj.contains_key("auth") {
        return Err("auth is only allowed in the user config".into());
    }
    for key in ["oauth", "auth"] {
        if obj.contains_key(key) {
            warnings.push(format!(
                "{source}: mcpServers.{name}.{key} ignored: not supported yet; pass credentials \
                 with \"headers\" (for example \"Authorization\": \"Bearer ${{TOKEN}}\")"
            ));
        }
    }
    let kind = opt_str(obj, "type")?;
    let has_definition = kind.is_some() || obj.contains_key("command") || obj.contains_key("url");
    let enabled = match obj.get("enabled") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err("\"enabled\" must be true or false".into()),
    };
    let exposure = opt_str(obj, "exposure")?
        .map(|s| parse_exposure(&s))
        .transpose()?;
    let tool_exposure = match obj.get("toolExposure") {
        None => Vec::new(),
        Some(Value::Object(m)) => {
            let mut rules = Vec::new();
            for (pattern, value) in m {
                let value = value
                    .as_str()
                    .ok_or_else(|| format!("toolExposure.\"{pattern}\" must be a string"))?;
                rules.push(ExposureRule::new(pattern, parse_exposure(value)?)?);
            }
            rules
        }
        Some(_) => {
            return Err("\"toolExposure\" must map tool names or patterns to exposures".into());
        }
    };
    if !has_definition {
        if let Some(key) = obj.keys().find(|k| !OVERRIDE_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "an override can only set enabled, exposure, toolExposure (found \"{key}\")"
            ));
        }
        return Ok(Entry::Override(Override {
            enabled,
            exposure,
            tool_exposure,
        }));
    }
    let transport = match kind.as_deref() {
        Some("sse") => {
            return Err(
                "type \"sse\" (legacy HTTP+SSE) is not supported; use a streamable HTTP endpoint \
                 (\"type\": \"http\")"
                    .into(),
            );
        }
        Some("http") | Some("streamable-http") => http_transport(obj)?,
        Some("stdio") => stdio_transport(obj)?,
        None if obj.contains_key("url") => http_transport(obj)?,
        None => stdio_transport(obj)?,
        Some(other) => {
            return Err(format!(
                "unknown type \"{other}\"; use \"stdio\" or \"http\""
            ));
        }
    };
    let timeout = match obj.get("timeout") {
        None => None,
        Some(v) => match v.as_f64() {
            Some(secs) if secs > 0.0 && secs.is_finite() => Some(Duration::from_secs_f64(secs)),
            _ => return Err("\"timeout\" must be a positive number of seconds".into()),
        },
    };
    let definition_keys = obj
        .keys()
        .filter(|k| !OVERRIDE_KEYS.contains(&k.as_str()) && KNOWN_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    let written = Override {
        enabled,
        exposure,
        tool_exposure: tool_exposure.clone(),
    };
    Ok(Entry::Full(
        Box::new(ServerConfig {
            name: name.to_string(),
            transport,
            enabled: enabled.unwrap_or(true),
            exposure: ExposureRules {
                default: exposure.unwrap_or_default(),
                rules: tool_exposure,
            },
            ceiling: None,
            timeout,
            description: opt_str(obj, "description")?,
            source: source.to_string(),
        }),
        written,
        definition_keys,
    ))
}

fn stdio_transport(obj: &Map<String, Value>) -> Result<ServerTransport, String> {
    let command = opt_str(obj, "command")?
        .filter(|c| !c.is_empty())
        .ok_or("a stdio server needs \"command\"")?;
    let args = match obj.get("args") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .ok_or("\"args\" must be an array of strings")
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("\"args\" must be an array of strings".into()),
    };
    Ok(ServerTransport::Stdio {
        command,
        args,
        env: string_map(obj, "env")?,
        cwd: opt_str(obj, "cwd")?.map(PathBuf::from),
    })
}

fn http_transport(obj: &Map<String, Value>) -> Result<ServerTransport, String> {
    let url = opt_str(obj, "url")?.ok_or("an http server needs \"url\"")?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "\"url\" must start with http:// or https:// (got \"{url}\")"
        ));
    }
    Ok(ServerTransport::Http {
        url,
        headers: string_map(obj, "headers")?,
    })
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("\"{key}\" must be a string")),
    }
}

fn string_map(obj: &Map<String, Value>, key: &str) -> Result<BTreeMap<String, String>, String> {
    match obj.get(key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| format!("{key}.{k} must be a string"))
            })
            .collect(),
        Some(_) => Err(format!("\"{key}\" must be an object of strings")),
    }
}

/// Expands `${VAR}` references from `lookup`. An unknown variable is an error naming it, so a
/// missing secret is never sent as an empty string.
pub fn expand_vars(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed \"${{\" in \"{value}\""))?;
        let var = &after[..end];
        let expanded = lookup(var).ok_or_else(|| {
            format!("environment variable {var} is not set; set it or remove the reference")
        })?;
        out.push_str(&expanded);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
