//! Loading `mcpServers` files: formats, validation, and the narrowing rule for projects.

use std::path::PathBuf;

use codemode_mcp::{McpConfig, ServerTransport, expand_vars};
use codemode_spec::Exposure;
use serde_json::json;

fn write(dir: &tempfile::TempDir, name: &str, v: serde_json::Value) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    p
}

fn user_and_project(
    user: serde_json::Value,
    project: serde_json::Value,
    trusted: bool,
) -> (McpConfig, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let u = write(&dir, "user.json", user);
    let p = write(&dir, "project.json", project);
    McpConfig::load(Some(&u), Some(&p), trusted).unwrap()
}

fn base_user() -> serde_json::Value {
    json!({"mcpServers": {
        "docs": {"command": "node", "args": ["docs.js"], "env": {"K": "${HOME}"}},
        "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${T}"},
                "exposure": "deferred", "toolExposure": {"get_*": "direct"}},
        "off": {"command": "x", "enabled": false}
    }})
}

#[test]
fn parses_stdio_and_http_servers() {
    let c = McpConfig::from_json(&base_user(), "user").unwrap();
    let docs = c.server("docs").unwrap();
    assert!(
        matches!(&docs.transport, ServerTransport::Stdio { command, args, env, .. }
        if command == "node" && args == &["docs.js"] && env["K"] == "${HOME}")
    );
    let web = c.server("web").unwrap();
    assert!(matches!(&web.transport, ServerTransport::Http { url, .. } if url.ends_with("/mcp")));
    assert_eq!(web.exposure_for("get_page"), Exposure::Direct);
    assert_eq!(web.exposure_for("search"), Exposure::Deferred);
    assert_eq!(docs.exposure_for("anything"), Exposure::Codemode);
    assert!(!c.server("off").unwrap().enabled);
    assert!(
        !c.auto_enable_codemode(),
        "activation is explicit by default"
    );
}

#[test]
fn strict_parsing_reports_bad_entries() {
    let err = McpConfig::from_json(&json!({"mcpServers": {"a b": {"command": "x"}}}), "cfg")
        .unwrap_err()
        .to_string();
    assert!(err.contains("letters, digits"), "{err}");
    let err = McpConfig::from_json(
        &json!({"mcpServers": {"s": {"type": "sse", "url": "http://x"}}}),
        "cfg",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not supported"), "{err}");
    let err = McpConfig::from_json(&json!({"autoEnableCodemode": "yes"}), "cfg")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("autoEnableCodemode must be a boolean"),
        "{err}"
    );
    let err = McpConfig::from_json(
        &json!({"mcpServers": {"s": {"command": "x", "exposure": "public"}}}),
        "cfg",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown exposure"), "{err}");
    let err = McpConfig::from_json(
        &json!({"mcpServers": {"a-b": {"command": "x"}, "a_b": {"command": "y"}}}),
        "cfg",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("conflicts"), "{err}");
}

#[test]
fn lenient_loading_skips_bad_entries_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let u = write(
        &dir,
        "user.json",
        json!({"mcpServers": {"good": {"command": "x"}, "bad": {"args": 3, "command": "y"}}}),
    );
    let (c, warnings) = McpConfig::load(Some(&u), None, false).unwrap();
    assert!(c.server("good").is_some());
    assert!(c.server("bad").is_none());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"bad\"") && w.contains("args")),
        "{warnings:?}"
    );
}

#[test]
fn missing_files_are_empty_and_broken_json_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (c, w) = McpConfig::load(Some(&dir.path().join("nope.json")), None, true).unwrap();
    assert!(c.servers().is_empty() && w.is_empty());
    let p = dir.path().join("broken.json");
    std::fs::write(&p, "{ not json").unwrap();
    let err = McpConfig::load(Some(&p), None, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not valid JSON"), "{err}");
}

#[test]
fn trusted_project_replaces_overrides_and_sets_auto_enable() {
    let mut user = base_user();
    user["autoEnableCodemode"] = json!(false);
    let (c, w) = user_and_project(
        user,
        json!({"autoEnableCodemode": true, "mcpServers": {
            "docs": {"exposure": "direct"},
            "web": {"command": "local-web"},
            "new": {"command": "n"},
            "x": {"enabled": false, "headers": {}}
        }}),
        true,
    );
    assert!(c.auto_enable_codemode());
    assert_eq!(
        c.server("docs").unwrap().exposure_for("t"),
        Exposure::Direct
    );
    assert!(
        matches!(&c.server("web").unwrap().transport, ServerTransport::Stdio { command, .. } if command == "local-web")
    );
    assert!(c.server("new").is_some());
    assert!(
        w.iter()
            .any(|m| m.contains("an override can only set enabled, exposure, toolExposure")),
        "{w:?}"
    );
}

#[test]
fn project_auth_is_refused() {
    let (_, w) = user_and_project(
        base_user(),
        json!({"mcpServers": {"p": {"url": "http://x/mcp", "auth": {"provider": "x"}}}}),
        true,
    );
    assert!(
        w.iter()
            .any(|m| m.contains("auth is only allowed in the user config")),
        "{w:?}"
    );
}

#[test]
fn untrusted_project_may_only_narrow() {
    let mut user = base_user();
    user["autoEnableCodemode"] = json!(true);
    let (c, w) = user_and_project(
        user,
        json!({"autoEnableCodemode": false, "mcpServers": {
            "docs": {"enabled": false},
            "web": {"exposure": "direct", "toolExposure": {"get_secret": "hidden", "search": "direct"}},
            "off": {"enabled": true},
            "evil": {"command": "rm", "args": ["-rf", "/"]}
        }}),
        false,
    );
    assert!(!c.server("docs").unwrap().enabled, "disabling is allowed");
    assert!(c.server("evil").is_none(), "adding is not");
    assert!(!c.server("off").unwrap().enabled, "enabling is not");
    let web = c.server("web").unwrap();
    assert_eq!(
        web.exposure_for("get_secret"),
        Exposure::Hidden,
        "hiding is allowed"
    );
    assert_eq!(
        web.exposure_for("get_page"),
        Exposure::Direct,
        "user's own rule still applies"
    );
    assert_eq!(
        web.exposure_for("search"),
        Exposure::Deferred,
        "widening ignored"
    );
    assert!(
        !c.auto_enable_codemode(),
        "turning auto-enable off is allowed"
    );
    for key in [
        "mcpServers.evil",
        "mcpServers.off.enabled",
        "mcpServers.web.exposure",
        "mcpServers.web.toolExposure.\"search\"",
    ] {
        assert!(
            w.iter().any(|m| m.contains(key)),
            "no warning naming {key}: {w:?}"
        );
    }
}

#[test]
fn untrusted_project_cannot_change_the_command_or_turn_auto_enable_on() {
    let (c, w) = user_and_project(
        base_user(),
        json!({"autoEnableCodemode": true, "mcpServers": {
            "docs": {"command": "evil", "exposure": "hidden"}
        }}),
        false,
    );
    let docs = c.server("docs").unwrap();
    assert!(matches!(&docs.transport, ServerTransport::Stdio { command, .. } if command == "node"));
    assert_eq!(
        docs.exposure_for("t"),
        Exposure::Hidden,
        "the narrowing part still applies"
    );
    assert!(
        w.iter().any(|m| m.contains("mcpServers.docs.command")),
        "{w:?}"
    );
    assert!(
        w.iter().any(|m| m.contains("autoEnableCodemode ignored")),
        "{w:?}"
    );
}

#[test]
fn codemode_needed_and_the_single_reachability_warning() {
    let c = McpConfig::from_json(&base_user(), "u").unwrap();
    assert!(c.codemode_needed());
    let warning = c.reachability_warning(false).unwrap();
    assert!(
        warning.contains("\"docs\"") && warning.contains("\"web\""),
        "{warning}"
    );
    assert!(warning.contains("autoEnableCodemode is false"), "{warning}");
    assert!(
        !warning.contains("\"off\""),
        "disabled servers are not mentioned: {warning}"
    );
    assert!(c.reachability_warning(true).is_none());

    let direct_only = McpConfig::from_json(
        &json!({"mcpServers": {"d": {"command": "x", "exposure": "direct"}}}),
        "u",
    )
    .unwrap();
    assert!(!direct_only.codemode_needed());
    assert!(direct_only.reachability_warning(false).is_none());

    let auto = McpConfig::from_json(
        &json!({"autoEnableCodemode": true, "mcpServers": {"d": {"command": "x"}}}),
        "u",
    )
    .unwrap();
    assert!(auto.auto_enable_codemode());
}

#[test]
fn variables_expand_and_unknown_ones_are_errors() {
    let lookup = |v: &str| (v == "TOKEN").then(|| "s3cret".to_string());
    assert_eq!(
        expand_vars("Bearer ${TOKEN}", &lookup).unwrap(),
        "Bearer s3cret"
    );
    assert_eq!(expand_vars("plain", &lookup).unwrap(), "plain");
    let err = expand_vars("${MISSING}", &lookup).unwrap_err();
    assert!(err.contains("MISSING") && err.contains("not set"), "{err}");
}
