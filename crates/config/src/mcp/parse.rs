//! Reading one `mcp.json` value into entries. A file of the wrong shape is an error; a bad server
//! entry is a problem that skips that server only, so one typo does not take every server down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use codemode_spec::Exposure;
use serde_json::{Map, Value};

use super::exposure::{ExposureRule, ExposureRules, parse_exposure};
use super::{ServerConfig, ServerTransport, check_vars};
use crate::{ConfigError, Problem};

/// Keys a project entry without `command`/`url`/`type` may set on one of your servers.
const OVERRIDE_KEYS: [&str; 5] = [
    "enabled",
    "disabled",
    "exposure",
    "toolExposure",
    "trustAnnotations",
];

/// Every key a server entry may hold.
const KNOWN_KEYS: [&str; 18] = [
    "type",
    "command",
    "args",
    "env",
    "envFile",
    "cwd",
    "url",
    "headers",
    "enabled",
    "disabled",
    "exposure",
    "toolExposure",
    "trustAnnotations",
    "timeout",
    "connectTimeoutMs",
    "description",
    "oauth",
    "auth",
];

/// One entry as written in a file, before merging.
#[derive(Debug, Clone)]
pub(super) enum Entry {
    /// A definition, plus its narrowing keys as written and its other keys (for untrusted
    /// projects, which may only narrow).
    Full(Box<ServerConfig>, Override, Vec<String>),
    Override(Override),
}

#[derive(Debug, Clone, Default)]
pub(super) struct Override {
    pub enabled: Option<bool>,
    pub exposure: Option<Exposure>,
    pub tool_exposure: Vec<ExposureRule>,
    pub trust_annotations: Option<bool>,
}

pub(super) struct ParsedFile {
    pub entries: Vec<(String, Entry)>,
    pub auto_enable_codemode: Option<bool>,
    pub connect_timeout: Option<Duration>,
    /// `mcpServers`, or `servers` for VS Code's format: named in messages.
    pub servers_key: &'static str,
    /// Entries that were skipped, and keys that were ignored.
    pub problems: Vec<Problem>,
}

pub(super) fn parse_file(
    v: &Value,
    source: &str,
    is_project: bool,
) -> Result<ParsedFile, ConfigError> {
    let shape = || {
        Problem::new(
            source,
            "",
            "expected a JSON object with an \"mcpServers\" object (or VS Code's \"servers\") mapping server names to their settings",
        )
    };
    let root = v.as_object().ok_or_else(shape)?;
    let mut problems = Vec::new();
    let auto_enable_codemode = match root.get("autoEnableCodemode") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(Problem::new(
                source,
                "autoEnableCodemode",
                "autoEnableCodemode must be a boolean: true or false",
            )
            .into());
        }
    };
    let connect_timeout = match root.get("connectTimeoutMs") {
        None => None,
        Some(v) => Some(millis(v).map_err(|m| Problem::new(source, "connectTimeoutMs", m))?),
    };
    let (servers_key, servers) = match (root.get("mcpServers"), root.get("servers")) {
        (Some(_), Some(_)) => {
            return Err(Problem::new(
                source,
                "servers",
                "the file has both \"mcpServers\" and VS Code's \"servers\"; keep one of them",
            )
            .into());
        }
        (Some(s), None) => ("mcpServers", Some(s)),
        (None, Some(s)) => ("servers", Some(s)),
        (None, None) => ("mcpServers", None),
    };
    let servers = match servers {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(Problem::new(
                source,
                servers_key,
                "must be an object mapping server names to their settings, such as {\"fs\": {\"command\": \"npx\", \"args\": [...]}}",
            )
            .into());
        }
    };
    for (key, value) in root {
        match key.as_str() {
            "mcpServers" | "servers" | "autoEnableCodemode" | "connectTimeoutMs" => {}
            "inputs" => {
                if value.as_array().is_some_and(|a| !a.is_empty()) {
                    problems.push(Problem::new(
                        source,
                        "inputs",
                        "ignored: VS Code's input prompts are not supported; put the values in environment variables and write ${env:NAME}",
                    ));
                }
            }
            other => problems.push(Problem::new(
                source,
                other,
                "ignored: unknown key (codemode reads mcpServers or servers, autoEnableCodemode and connectTimeoutMs)",
            )),
        }
    }
    let mut entries = Vec::new();
    for (name, raw) in &servers {
        let at = format!("{servers_key}.{name}");
        match parse_entry(name, raw, source, &at, is_project, &mut problems) {
            Ok(entry) => entries.push((name.clone(), entry)),
            Err((key, message)) => problems.push(Problem::new(
                source,
                if key.is_empty() {
                    at
                } else {
                    format!("{at}.{key}")
                },
                format!("{message}; the server is left out"),
            )),
        }
    }
    Ok(ParsedFile {
        entries,
        auto_enable_codemode,
        connect_timeout,
        servers_key,
        problems,
    })
}

/// A bad entry: the key within the entry (empty for the entry itself) and the message.
type Bad = (String, String);

fn bad(key: &str, message: impl Into<String>) -> Bad {
    (key.to_string(), message.into())
}

/// Why a server name could make its tools' names ambiguous, if it could.
///
/// A server's tools are named `mcp__<server>__<tool>` with `-` read as `_`. A name with `__`
/// inside, or `_` at either end, would let two servers produce the same tool name (`a` with a
/// tool `b__c`, and `a__b` with a tool `c`), and let one server's tools match patterns, hooks and
/// policies written for the other. Without them, the first `__` after `mcp__` always ends the
/// server's name.
fn ambiguous_name(name: &str) -> Option<String> {
    let mapped = name.replace('-', "_");
    let at_end = mapped.starts_with('_') || mapped.ends_with('_');
    if !mapped.contains("__") && !at_end {
        return None;
    }
    let suggestion: String = mapped
        .split('_')
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    let fix = if suggestion.is_empty() {
        "give it a name with letters or digits".to_string()
    } else {
        format!("rename it, for example to \"{suggestion}\"")
    };
    Some(format!(
        "the name may not hold two - or _ in a row, or begin or end with one: its tools are named \
         mcp__<server>__<tool>, and such a name could give two servers the same tool name; {fix}"
    ))
}

fn parse_entry(
    name: &str,
    raw: &Value,
    source: &str,
    at: &str,
    is_project: bool,
    problems: &mut Vec<Problem>,
) -> Result<Entry, Bad> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(bad("", "the name may only hold letters, digits, - and _"));
    }
    if let Some(why) = ambiguous_name(name) {
        return Err(bad("", why));
    }
    let obj = raw.as_object().ok_or_else(|| {
        bad(
            "",
            "the settings must be an object such as {\"command\": \"...\"}",
        )
    })?;
    for key in obj.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            problems.push(Problem::new(
                source,
                format!("{at}.{key}"),
                "ignored: unknown key",
            ));
        }
    }
    if is_project && obj.contains_key("auth") {
        return Err(bad(
            "auth",
            "auth is only allowed in your own mcp.json, not a project's",
        ));
    }
    if obj.contains_key("envFile") {
        return Err(bad(
            "envFile",
            "env files are not read; list the variables under \"env\" (values may be ${VAR})",
        ));
    }
    for key in ["oauth", "auth"] {
        if obj.contains_key(key) {
            problems.push(Problem::new(
                source,
                format!("{at}.{key}"),
                "ignored: not supported yet; pass credentials with \"headers\" (for example \"Authorization\": \"Bearer ${TOKEN}\")",
            ));
        }
    }
    let kind = opt_str(obj, "type")?;
    let has_definition = kind.is_some() || obj.contains_key("command") || obj.contains_key("url");
    let enabled = match (opt_bool(obj, "enabled")?, opt_bool(obj, "disabled")?) {
        (Some(e), Some(d)) if e == d => {
            return Err(bad(
                "disabled",
                "\"enabled\" and \"disabled\" contradict each other; keep one",
            ));
        }
        (Some(e), _) => Some(e),
        (None, Some(d)) => Some(!d),
        (None, None) => None,
    };
    let exposure = opt_str(obj, "exposure")?
        .map(|s| parse_exposure(&s).map_err(|m| bad("exposure", m)))
        .transpose()?;
    let tool_exposure = match obj.get("toolExposure") {
        None => Vec::new(),
        Some(Value::Object(m)) => {
            let mut rules = Vec::new();
            for (pattern, value) in m {
                let key = format!("toolExposure.\"{pattern}\"");
                let value = value.as_str().ok_or_else(|| {
                    bad(
                        &key,
                        "must be an exposure: direct, codemode, deferred or hidden",
                    )
                })?;
                let exposure = parse_exposure(value).map_err(|m| bad(&key, m))?;
                rules.push(ExposureRule::new(pattern, exposure).map_err(|m| bad(&key, m))?);
            }
            rules
        }
        Some(_) => {
            return Err(bad(
                "toolExposure",
                "must map tool names or patterns to exposures, such as {\"delete_*\": \"hidden\"}",
            ));
        }
    };
    let trust_annotations = opt_bool(obj, "trustAnnotations")?;
    if !has_definition {
        if let Some(key) = obj.keys().find(|k| !OVERRIDE_KEYS.contains(&k.as_str())) {
            return Err(bad(
                key,
                "an override (an entry without \"command\" or \"url\") can only set enabled, exposure, toolExposure, trustAnnotations",
            ));
        }
        return Ok(Entry::Override(Override {
            enabled,
            exposure,
            tool_exposure,
            trust_annotations,
        }));
    }
    let transport = match kind.as_deref() {
        Some("sse") => {
            return Err(bad(
                "type",
                "type \"sse\" (legacy HTTP+SSE) is not supported; use the server's streamable HTTP endpoint (\"type\": \"http\")",
            ));
        }
        Some("http") | Some("streamable-http") | Some("streamableHttp") => http_transport(obj)?,
        Some("stdio") => stdio_transport(obj)?,
        None if obj.contains_key("url") => http_transport(obj)?,
        None => stdio_transport(obj)?,
        Some(other) => {
            return Err(bad(
                "type",
                format!("unknown type \"{other}\"; use \"stdio\" or \"http\""),
            ));
        }
    };
    for (key, value) in transport.values() {
        check_vars(&value).map_err(|m| bad(&key, m))?;
    }
    let timeout = match obj.get("timeout") {
        None => None,
        Some(v) => match v.as_f64() {
            Some(secs) if secs > 0.0 && secs.is_finite() && secs < 1e9 => {
                Some(Duration::from_secs_f64(secs))
            }
            _ => return Err(bad("timeout", "must be a positive number of seconds")),
        },
    };
    let connect_timeout = obj
        .get("connectTimeoutMs")
        .map(millis)
        .transpose()
        .map_err(|m| bad("connectTimeoutMs", m))?;
    let other_keys = obj
        .keys()
        .filter(|k| !OVERRIDE_KEYS.contains(&k.as_str()) && KNOWN_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    let written = Override {
        enabled,
        exposure,
        tool_exposure: tool_exposure.clone(),
        trust_annotations,
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
            trust_annotations: trust_annotations.unwrap_or(true),
            timeout,
            connect_timeout,
            description: opt_str(obj, "description")?,
            source: source.to_string(),
            start_dir: None,
            project_dir: None,
        }),
        written,
        other_keys,
    ))
}

/// A positive number of milliseconds.
fn millis(v: &Value) -> Result<Duration, String> {
    match v.as_u64() {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err("must be a positive whole number of milliseconds, such as 60000".into()),
    }
}

fn stdio_transport(obj: &Map<String, Value>) -> Result<ServerTransport, Bad> {
    let command = opt_str(obj, "command")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            bad(
                "command",
                "a stdio server needs \"command\": the program to start",
            )
        })?;
    let args = match obj.get("args") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("args", "must be an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("args", "must be an array of strings")),
    };
    Ok(ServerTransport::Stdio {
        command,
        args,
        env: string_map(obj, "env")?,
        cwd: opt_str(obj, "cwd")?.map(PathBuf::from),
    })
}

fn http_transport(obj: &Map<String, Value>) -> Result<ServerTransport, Bad> {
    let url = opt_str(obj, "url")?.ok_or_else(|| bad("url", "an http server needs \"url\""))?;
    let scheme_ok =
        url.starts_with("http://") || url.starts_with("https://") || url.starts_with("${");
    if !scheme_ok {
        return Err(bad(
            "url",
            format!("must start with http:// or https:// (got \"{url}\")"),
        ));
    }
    Ok(ServerTransport::Http {
        url,
        headers: string_map(obj, "headers")?,
    })
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, Bad> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(key, "must be a string")),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, Bad> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(key, "must be true or false")),
    }
}

fn string_map(obj: &Map<String, Value>, key: &str) -> Result<BTreeMap<String, String>, Bad> {
    match obj.get(key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| bad(&format!("{key}.{k}"), "must be a string"))
            })
            .collect(),
        Some(_) => Err(bad(key, "must be an object of strings")),
    }
}
