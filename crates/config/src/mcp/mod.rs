//! `mcp.json`: which MCP servers to connect, how each tool of theirs is exposed, and the merge
//! of the user's file with a project's.
//!
//! The formats people paste from other clients are read as they are: `{"mcpServers": …}` (Claude
//! Desktop, Claude Code, Cursor, Cline) and `{"servers": …}` (VS Code), with comments and
//! trailing commas, `"disabled": true`, `"type": "stdio" | "http"`, and `${VAR}`,
//! `${VAR:-default}` and `${env:VAR}` in the command, arguments, environment, URL and headers.
//! codemode adds `enabled`, `exposure`, `toolExposure`, `timeout`, `connectTimeoutMs` and
//! `description` per server, and `autoEnableCodemode` and `connectTimeoutMs` for the file.

mod exposure;
mod parse;
mod vars;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use codemode_spec::Exposure;
use serde_json::Value;

pub use exposure::{ExposureRule, ExposureRules, narrower, parse_exposure};
pub use vars::{check_vars, expand_vars, var_names};

use crate::narrow::Narrowing;
use crate::{ConfigError, Problem};
use parse::{Entry, Override, ParsedFile};

/// How long a server may take to start and list its tools when no file says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How codemode reaches a server. Values may hold `${VAR}` references until
/// [`ServerTransport::expanded`] resolves them, when the server is started.
#[derive(Clone, PartialEq, Eq)]
pub enum ServerTransport {
    /// A local process speaking MCP over stdin/stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Names the environment variables and headers but never prints their values, which may be
/// secrets.
impl fmt::Debug for ServerTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            ServerTransport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl ServerTransport {
    /// Every `${VAR}` resolved with `lookup`. An error names the key (`args[2]`,
    /// `headers.Authorization`) and what to do.
    pub fn expanded(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let one = |key: &str, value: &str| {
            expand_vars(value, lookup).map_err(|e| format!("`{key}`: {e}"))
        };
        let map = |name: &str, m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| Ok((k.clone(), one(&format!("{name}.{k}"), v)?)))
                .collect::<Result<BTreeMap<_, _>, String>>()
        };
        Ok(match self {
            ServerTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => ServerTransport::Stdio {
                command: one("command", command)?,
                args: args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| one(&format!("args[{i}]"), a))
                    .collect::<Result<_, _>>()?,
                env: map("env", env)?,
                cwd: cwd
                    .as_ref()
                    .map(|c| one("cwd", &c.to_string_lossy()).map(PathBuf::from))
                    .transpose()?,
            },
            ServerTransport::Http { url, headers } => ServerTransport::Http {
                url: one("url", url)?,
                headers: map("headers", headers)?,
            },
        })
    }

    /// Every value with references, with its key, for checking them when the file is read.
    fn values(&self) -> Vec<(String, String)> {
        match self {
            ServerTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut out = vec![("command".to_string(), command.clone())];
                out.extend(
                    args.iter()
                        .enumerate()
                        .map(|(i, a)| (format!("args[{i}]"), a.clone())),
                );
                out.extend(env.iter().map(|(k, v)| (format!("env.{k}"), v.clone())));
                if let Some(c) = cwd {
                    out.push(("cwd".into(), c.to_string_lossy().into_owned()));
                }
                out
            }
            ServerTransport::Http { url, headers } => {
                let mut out = vec![("url".to_string(), url.clone())];
                out.extend(
                    headers
                        .iter()
                        .map(|(k, v)| (format!("headers.{k}"), v.clone())),
                );
                out
            }
        }
    }
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
    /// Whether the server's own tool annotations (`readOnlyHint`, `destructiveHint`, …) are
    /// believed (`trustAnnotations`, default true). When false its tools count as tools that may
    /// change something, whatever they claim, so the default policy asks before each call.
    pub trust_annotations: bool,
    /// Per-request timeout for this server (`timeout`, seconds), overriding the hub's default.
    pub timeout: Option<Duration>,
    /// How long this server may take to start and list its tools (`connectTimeoutMs`),
    /// overriding the file's and the built-in default.
    pub connect_timeout: Option<Duration>,
    /// One sentence saying what the server is for, shown with its namespace.
    pub description: Option<String>,
    /// The file (or label) that defined the server.
    pub source: String,
    /// Where a stdio server starts, and what a relative `cwd` is relative to: the directory of
    /// the file that defined it (your `mcp.json`'s), or the project for a trusted project's
    /// server. Never an untrusted project, which would otherwise choose the program (`npx`
    /// prefers a `node_modules/.bin` it finds from there upward). `None` for configuration
    /// handed over by an embedding program: the process's current directory.
    pub start_dir: Option<PathBuf>,
    /// The project codemode works in: `$CODEMODE_PROJECT_DIR` for the server, and
    /// `${CODEMODE_PROJECT_DIR}` in its settings.
    pub project_dir: Option<PathBuf>,
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
    auto_enable_codemode: Option<bool>,
    connect_timeout: Option<Duration>,
}

impl McpConfig {
    /// Loads your file and, if given, the project's, and merges them.
    ///
    /// A missing file counts as empty. A file that is not JSON(C), or not an object, is an error
    /// (so a typo never silently drops every server); a bad server entry is skipped with a
    /// warning naming the file, the server, the key and what to do. A trusted project may add,
    /// replace and override servers. An untrusted project may only narrow: disable servers,
    /// lower exposures and timeouts, turn `autoEnableCodemode` off; every wider setting it holds
    /// is ignored with a warning naming the key.
    pub fn load(
        user_file: Option<&Path>,
        project_file: Option<&Path>,
        project_trusted: bool,
    ) -> Result<(McpConfig, Vec<String>), ConfigError> {
        let mut warnings = Vec::new();
        let mut config = McpConfig::default();
        let mut problems = Vec::new();
        let user = user_file.map(read).transpose();
        let project = project_file.map(read).transpose();
        let (user, project) = match (user, project) {
            (Ok(u), Ok(p)) => (u.flatten(), p.flatten()),
            (u, p) => {
                problems.extend(u.err());
                problems.extend(p.err());
                return Err(ConfigError { problems });
            }
        };
        if let Some((v, source)) = user {
            let parsed = parse::parse_file(&v, &source, false)?;
            config.apply_user(parsed, &source, &mut problems);
            config.start_new_servers_in(user_file.and_then(Path::parent));
        }
        // `<project>/.codemode/mcp.json`
        let project_dir = project_file.and_then(Path::parent).and_then(Path::parent);
        if let Some((v, source)) = project {
            let parsed = parse::parse_file(&v, &source, true)?;
            if project_trusted {
                config.apply_trusted_project(parsed, &source, &mut problems);
                config.start_new_servers_in(project_dir);
            } else {
                warnings.extend(config.apply_untrusted_project(parsed, &source, &mut problems));
            }
        }
        if let Some(dir) = project_dir {
            for s in &mut config.servers {
                s.project_dir = Some(dir.to_path_buf());
            }
        }
        let mut all: Vec<String> = problems.iter().map(Problem::to_string).collect();
        all.extend(warnings);
        Ok((config, all))
    }

    /// Parses one configuration value strictly: any invalid entry is an error. For configuration
    /// handed over by an embedding program, where there is nobody to show warnings to.
    pub fn from_json(v: &Value, source: &str) -> Result<McpConfig, ConfigError> {
        let parsed = parse::parse_file(v, source, false)?;
        let mut problems = Vec::new();
        let mut config = McpConfig::default();
        config.apply_user(parsed, source, &mut problems);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Servers added since the last call start in `dir`.
    fn start_new_servers_in(&mut self, dir: Option<&Path>) {
        // A relative file name (`--mcp-config mcp.json`) is relative to where codemode started.
        let dir = dir.and_then(|d| std::path::absolute(d).ok());
        for s in self.servers.iter_mut().filter(|s| s.start_dir.is_none()) {
            s.start_dir = dir.clone();
        }
    }

    /// All configured servers, enabled or not, in file order.
    pub fn servers(&self) -> &[ServerConfig] {
        &self.servers
    }

    pub fn server(&self, name: &str) -> Option<&ServerConfig> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// How long a server may take to start when it sets no `connectTimeoutMs` of its own.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT)
    }

    /// The file's `connectTimeoutMs`, if one was set (after the narrowing rule).
    pub fn connect_timeout_setting(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// `autoEnableCodemode` as merged (default false: activation is explicit).
    pub fn auto_enable_setting(&self) -> bool {
        self.auto_enable_codemode.unwrap_or(false)
    }

    /// Whether MCP servers switch the `codemode` tool on: `autoEnableCodemode` is true and some
    /// enabled server has tools only a script can call.
    pub fn auto_enable_codemode(&self) -> bool {
        self.auto_enable_setting() && self.codemode_needed()
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
        let why = if self.auto_enable_setting() {
            ""
        } else {
            " (autoEnableCodemode is false)"
        };
        Some(format!(
            "MCP tools of {} can only be called from codemode scripts, but the codemode tool is \
             not enabled{why}; they cannot be called. Enable codemode (choose a mode with --mode \
             or \"mode\" in settings.json), set \"autoEnableCodemode\": true in mcp.json, or give \
             those tools exposure \"direct\".",
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

    fn apply_user(&mut self, parsed: ParsedFile, source: &str, problems: &mut Vec<Problem>) {
        problems.extend(parsed.problems);
        if parsed.auto_enable_codemode.is_some() {
            self.auto_enable_codemode = parsed.auto_enable_codemode;
        }
        if parsed.connect_timeout.is_some() {
            self.connect_timeout = parsed.connect_timeout;
        }
        for (name, entry) in parsed.entries {
            match entry {
                Entry::Full(server, ..) => self.insert(*server, source, problems),
                Entry::Override(_) => problems.push(Problem::new(
                    source,
                    format!("{}.{name}", parsed.servers_key),
                    "needs \"command\" (a program to start) or \"url\" (a streamable HTTP endpoint)",
                )),
            }
        }
    }

    fn apply_trusted_project(
        &mut self,
        parsed: ParsedFile,
        source: &str,
        problems: &mut Vec<Problem>,
    ) {
        problems.extend(parsed.problems);
        if parsed.auto_enable_codemode.is_some() {
            self.auto_enable_codemode = parsed.auto_enable_codemode;
        }
        if parsed.connect_timeout.is_some() {
            self.connect_timeout = parsed.connect_timeout;
        }
        for (name, entry) in parsed.entries {
            match entry {
                Entry::Full(server, ..) => {
                    self.servers.retain(|s| s.name != name);
                    self.insert(*server, source, problems);
                }
                Entry::Override(o) => {
                    let Some(server) = self.servers.iter_mut().find(|s| s.name == name) else {
                        problems.push(Problem::new(
                            source,
                            format!("{}.{name}", parsed.servers_key),
                            "needs \"command\" or \"url\", or a server of that name in your own mcp.json to override",
                        ));
                        continue;
                    };
                    if let Some(enabled) = o.enabled {
                        server.enabled = enabled;
                    }
                    if let Some(exposure) = o.exposure {
                        server.exposure.default = exposure;
                    }
                    if let Some(trust) = o.trust_annotations {
                        server.trust_annotations = trust;
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

    /// Applies an untrusted project's file, keeping only what narrows. Returns the warnings.
    fn apply_untrusted_project(
        &mut self,
        parsed: ParsedFile,
        source: &str,
        problems: &mut Vec<Problem>,
    ) -> Vec<String> {
        problems.extend(parsed.problems);
        let mut n = Narrowing::new(source, false);
        self.auto_enable_codemode = n.switch_off(
            "autoEnableCodemode",
            self.auto_enable_codemode,
            parsed.auto_enable_codemode,
            false,
        );
        if parsed.connect_timeout.is_some() {
            let ms = |d: Duration| d.as_millis() as u64;
            self.connect_timeout = n
                .limit(
                    "connectTimeoutMs",
                    Some(ms(self.connect_timeout())),
                    parsed.connect_timeout.map(ms),
                )
                .map(Duration::from_millis);
        }
        let key = parsed.servers_key;
        for (name, entry) in parsed.entries {
            let Some(server) = self.servers.iter_mut().find(|s| s.name == name) else {
                n.ignore(
                    &format!("{key}.{name}"),
                    "it adds a server, which starts a program or reaches a URL of the project's choosing; add the server to your own mcp.json instead",
                );
                continue;
            };
            let o = match entry {
                Entry::Override(o) => o,
                Entry::Full(project, o, keys) => {
                    for k in keys.iter().filter(|k| !repeats(k, &project, server)) {
                        n.ignore(
                            &format!("{key}.{name}.{k}"),
                            "it changes how a server is started or reached",
                        );
                    }
                    o
                }
            };
            narrow_server(server, o, &format!("{key}.{name}"), &mut n);
        }
        n.into_warnings()
    }

    fn insert(&mut self, server: ServerConfig, source: &str, problems: &mut Vec<Problem>) {
        let key = server.name.replace('-', "_");
        if let Some(other) = self
            .servers
            .iter()
            .find(|s| s.name != server.name && s.name.replace('-', "_") == key)
        {
            problems.push(Problem::new(
                source,
                format!("mcpServers.{}", server.name),
                format!(
                    "conflicts with \"{}\" (names that differ only in - and _ map to the same tool names); rename one",
                    other.name
                ),
            ));
            return;
        }
        self.servers.retain(|s| s.name != server.name);
        self.servers.push(server);
    }
}

/// Applies an untrusted project's settings for one server, keeping only what narrows.
fn narrow_server(server: &mut ServerConfig, o: Override, at: &str, n: &mut Narrowing) {
    server.enabled = n
        .switch_off(
            &format!("{at}.enabled"),
            Some(server.enabled),
            o.enabled,
            true,
        )
        .unwrap_or(server.enabled);
    // Believing a server's claims widens what runs without asking, so a project may only stop it.
    server.trust_annotations = n
        .switch_off(
            &format!("{at}.trustAnnotations"),
            Some(server.trust_annotations),
            o.trust_annotations,
            true,
        )
        .unwrap_or(server.trust_annotations);
    let mut ceiling = server.ceiling.take().unwrap_or(ExposureRules {
        default: Exposure::Direct,
        rules: Vec::new(),
    });
    if let Some(exposure) = o.exposure {
        let kept = n.visibility(
            &format!("{at}.exposure"),
            server.exposure.default,
            Some(exposure),
        );
        if kept == exposure {
            ceiling.default = narrower(ceiling.default, exposure);
        }
    }
    let mut rules = Vec::new();
    for rule in o.tool_exposure {
        let current = server.exposure.lookup(&rule.pattern);
        let kept = n.visibility(
            &format!("{at}.toolExposure.\"{}\"", rule.pattern),
            current,
            Some(rule.exposure),
        );
        if kept == rule.exposure {
            rules.push(rule);
        }
    }
    rules.append(&mut ceiling.rules);
    ceiling.rules = rules;
    server.ceiling = Some(ceiling);
}

fn read(path: &Path) -> Result<Option<(Value, String)>, Problem> {
    Ok(crate::jsonc::read(path)?.map(|v| (v, path.display().to_string())))
}

/// Whether an untrusted project's `key` says what the user's own entry says already: a copy of
/// the user's entry changes nothing, so it is not warned about.
fn repeats(key: &str, project: &ServerConfig, user: &ServerConfig) -> bool {
    use ServerTransport::{Http, Stdio};
    match (key, &project.transport, &user.transport) {
        ("type", Stdio { .. }, Stdio { .. }) | ("type", Http { .. }, Http { .. }) => true,
        ("command", Stdio { command: a, .. }, Stdio { command: b, .. }) => a == b,
        ("args", Stdio { args: a, .. }, Stdio { args: b, .. }) => a == b,
        ("env", Stdio { env: a, .. }, Stdio { env: b, .. }) => a == b,
        ("cwd", Stdio { cwd: a, .. }, Stdio { cwd: b, .. }) => a == b,
        ("url", Http { url: a, .. }, Http { url: b, .. }) => a == b,
        ("headers", Http { headers: a, .. }, Http { headers: b, .. }) => a == b,
        ("timeout", ..) => project.timeout == user.timeout,
        ("connectTimeoutMs", ..) => project.connect_timeout == user.connect_timeout,
        ("description", ..) => project.description == user.description,
        _ => false,
    }
}
