//! Loading MCP server files: the formats other clients write, validation with one clear message
//! per problem, and the narrowing rule for projects.

use std::path::PathBuf;
use std::time::Duration;

use codemode_config::mcp::{McpConfig, ServerTransport, expand_vars};
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

/// `a` with a tool `b__c` and `a__b` with a tool `c` would both be `mcp__a__b__c`; a name
/// that could collide so is refused, whichever way it is spelt.
#[test]
fn a_server_name_that_could_share_tool_names_with_another_is_refused() {
    for name in [
        "github__x",
        "github--x",
        "github-_x",
        "_github",
        "github_",
        "-github",
        "__",
    ] {
        let err = McpConfig::from_json(
            &json!({"mcpServers": {"github": {"command": "x"}, name: {"command": "y"}}}),
            "cfg",
        )
        .expect_err(name)
        .to_string();
        assert!(err.contains(name), "{name}: the server is named: {err}");
        assert!(err.contains("two - or _ in a row"), "{name}: {err}");
    }
    let err = McpConfig::from_json(
        &json!({"mcpServers": {"my--docs": {"command": "x"}}}),
        "cfg",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("rename it, for example to \"my_docs\""),
        "{err}"
    );
    // One - or _ between letters is fine.
    let c = McpConfig::from_json(
        &json!({"mcpServers": {"my-docs": {"command": "x"}, "web_2": {"command": "y"}}}),
        "cfg",
    )
    .unwrap();
    assert_eq!(c.servers().len(), 2);
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
            .any(|w| w.contains("`mcpServers.bad.args`") && w.contains("array of strings")),
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
            .any(|m| m.contains("can only set enabled, exposure, toolExposure")),
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
            .any(|m| m.contains("auth is only allowed in your own mcp.json")),
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
        w.iter().any(|m| m.contains("ignored `autoEnableCodemode`")),
        "{w:?}"
    );
}

#[test]
fn an_untrusted_project_repeating_the_users_server_is_not_warned_about() {
    let (c, w) = user_and_project(
        base_user(),
        json!({"mcpServers": {
            "docs": {"type": "stdio", "command": "node", "args": ["docs.js"], "exposure": "hidden"},
            "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer other"}}
        }}),
        false,
    );
    assert!(
        !w.iter().any(|m| m.contains("mcpServers.docs")),
        "an unchanged command and args warn of nothing: {w:?}"
    );
    assert_eq!(
        c.server("docs").unwrap().exposure_for("t"),
        Exposure::Hidden
    );
    assert!(
        w.iter().any(|m| m.contains("mcpServers.web.headers")),
        "a changed header is still refused: {w:?}"
    );
    assert!(!w.iter().any(|m| m.contains("mcpServers.web.url")), "{w:?}");
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

fn load_text(user: &str, project: Option<&str>, trusted: bool) -> (McpConfig, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let u = dir.path().join("mcp.json");
    std::fs::write(&u, user).unwrap();
    let p = project.map(|text| {
        let p = dir.path().join("project-mcp.json");
        std::fs::write(&p, text).unwrap();
        p
    });
    McpConfig::load(Some(&u), p.as_deref(), trusted).unwrap()
}

#[test]
fn vs_code_servers_format_with_comments_and_trailing_commas() {
    let text = r#"{
        // VS Code's .vscode/mcp.json
        "inputs": [{"type": "promptString", "id": "key", "description": "API key", "password": true}],
        "servers": {
            "fs": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "${env:HOME}",],},
            /* remote */
            "gh": {"type": "http", "url": "https://example.invalid/mcp", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN:-none}"}},
        },
    }"#;
    let (c, w) = load_text(text, None, false);
    assert!(
        matches!(&c.server("fs").unwrap().transport, ServerTransport::Stdio { command, args, .. }
        if command == "npx" && args[2] == "${env:HOME}")
    );
    assert!(matches!(
        &c.server("gh").unwrap().transport,
        ServerTransport::Http { .. }
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("`inputs`") && w[0].contains("${env:NAME}"),
        "{w:?}"
    );

    let err = McpConfig::from_json(&json!({"servers": {}, "mcpServers": {}}), "both.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("both.json") && err.contains("keep one"),
        "{err}"
    );
}

#[test]
fn a_syntax_error_names_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mcp.json");
    std::fs::write(
        &p,
        "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\"}\n    \"b\": {}\n  }\n}",
    )
    .unwrap();
    let err = McpConfig::load(Some(&p), None, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mcp.json") && err.contains("Expected comma on line 3"),
        "{err}"
    );
}

#[test]
fn disabled_true_skips_the_server_and_projects_may_only_disable() {
    let user = r#"{"mcpServers": {
        "a": {"command": "x", "disabled": true},
        "b": {"command": "y", "disabled": false},
        "c": {"command": "z"},
        "both": {"command": "z", "enabled": true, "disabled": true}
    }}"#;
    let (c, w) = load_text(user, None, false);
    assert!(!c.server("a").unwrap().enabled);
    assert!(c.server("b").unwrap().enabled);
    assert!(c.server("both").is_none(), "contradiction is left out");
    assert!(
        w.iter()
            .any(|m| m.contains("`mcpServers.both.disabled`") && m.contains("contradict")),
        "{w:?}"
    );
    let project = r#"{"mcpServers": {"a": {"disabled": false}, "c": {"disabled": true}}}"#;
    let (c, w) = load_text(user, Some(project), false);
    assert!(
        !c.server("a").unwrap().enabled,
        "an untrusted project cannot enable"
    );
    assert!(!c.server("c").unwrap().enabled, "but may disable");
    assert!(
        w.iter().any(|m| m.contains("`mcpServers.a.enabled`")),
        "{w:?}"
    );
    let (c, _) = load_text(user, Some(project), true);
    assert!(
        c.server("a").unwrap().enabled,
        "a trusted project may enable"
    );
}

#[test]
fn variables_in_every_field_expand_in_every_spelling() {
    let c = McpConfig::from_json(
        &json!({"mcpServers": {
            "s": {"command": "${TOOL_BIN:-node}", "args": ["${env:DIR}/srv.js", "--key=${KEY}"],
                  "env": {"A": "${KEY}"}, "cwd": "${DIR}"},
            "h": {"url": "${BASE:-http://127.0.0.1:1}/mcp", "headers": {"Authorization": "Bearer ${KEY}"}}
        }}),
        "mcp.json",
    )
    .unwrap();
    let env = |v: &str| match v {
        "DIR" => Some("/srv".to_string()),
        "KEY" => Some("k1".to_string()),
        _ => None,
    };
    let s = c.server("s").unwrap().transport.expanded(&env).unwrap();
    let ServerTransport::Stdio {
        command,
        args,
        env: vars,
        cwd,
    } = s
    else {
        panic!()
    };
    assert_eq!(command, "node");
    assert_eq!(args, ["/srv/srv.js", "--key=k1"]);
    assert_eq!(vars["A"], "k1");
    assert_eq!(cwd.unwrap(), PathBuf::from("/srv"));
    let h = c.server("h").unwrap().transport.expanded(&env).unwrap();
    let ServerTransport::Http { url, headers } = h else {
        panic!()
    };
    assert_eq!(url, "http://127.0.0.1:1/mcp");
    assert_eq!(headers["Authorization"], "Bearer k1");

    let err = c
        .server("s")
        .unwrap()
        .transport
        .expanded(&|_| None)
        .unwrap_err();
    assert!(
        err.contains("`args[0]`") && err.contains("DIR") && err.contains("${DIR:-value}"),
        "{err}"
    );
}

#[test]
fn a_bad_reference_leaves_that_server_out_naming_server_and_key() {
    let (c, w) = load_text(
        r#"{"mcpServers": {
            "ok": {"command": "x"},
            "vs": {"command": "x", "args": ["${input:api-key}"]},
            "open": {"url": "http://x/mcp", "headers": {"A": "${TOKEN"}}
        }}"#,
        None,
        false,
    );
    assert!(c.server("ok").is_some());
    assert!(c.server("vs").is_none() && c.server("open").is_none());
    let all = w.join("\n");
    assert!(
        all.contains("`mcpServers.vs.args[0]`") && all.contains("${env:NAME}"),
        "{all}"
    );
    assert!(
        all.contains("`mcpServers.open.headers.A`") && all.contains("not closed"),
        "{all}"
    );
    assert!(
        w.iter().all(|m| m.contains("mcp.json")),
        "each names the file: {all}"
    );
}

#[test]
fn connect_timeouts_per_server_and_for_the_file() {
    let (c, _) = load_text(
        r#"{"connectTimeoutMs": 90000, "mcpServers": {"slow": {"command": "npx", "connectTimeoutMs": 120000}, "other": {"command": "y"}}}"#,
        None,
        false,
    );
    assert_eq!(c.connect_timeout(), Duration::from_secs(90));
    assert_eq!(
        c.server("slow").unwrap().connect_timeout,
        Some(Duration::from_secs(120))
    );
    assert_eq!(c.server("other").unwrap().connect_timeout, None);
    let (c, _) = load_text(r#"{"mcpServers": {}}"#, None, false);
    assert_eq!(
        c.connect_timeout(),
        Duration::from_secs(30),
        "the built-in default"
    );

    // An untrusted project may lower the timeout, not raise it.
    let (c, w) = load_text(
        r#"{"connectTimeoutMs": 5000}"#,
        Some(r#"{"connectTimeoutMs": 600000}"#),
        false,
    );
    assert_eq!(c.connect_timeout(), Duration::from_secs(5));
    assert!(w.iter().any(|m| m.contains("`connectTimeoutMs`")), "{w:?}");
    let (c, _) = load_text(r#"{}"#, Some(r#"{"connectTimeoutMs": 1000}"#), false);
    assert_eq!(c.connect_timeout(), Duration::from_secs(1));

    let err = McpConfig::from_json(&json!({"connectTimeoutMs": "soon"}), "t.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`connectTimeoutMs`") && err.contains("milliseconds"),
        "{err}"
    );
    let err = McpConfig::from_json(
        &json!({"mcpServers": {"s": {"command": "x", "connectTimeoutMs": 0}}}),
        "t.json",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`mcpServers.s.connectTimeoutMs`"), "{err}");
}

#[test]
fn pasted_claude_desktop_file_keeps_its_servers_and_names_what_is_ignored() {
    let (c, w) = load_text(
        r#"{"globalShortcut": "Ctrl+Space", "mcpServers": {"m": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "autoApprove": []}}}"#,
        None,
        false,
    );
    assert!(c.server("m").is_some());
    let all = w.join("\n");
    assert!(
        all.contains("`globalShortcut`") && all.contains("`mcpServers.m.autoApprove`"),
        "{all}"
    );
}

#[test]
fn debug_output_never_shows_secret_values() {
    let c = McpConfig::from_json(
        &json!({"mcpServers": {
            "h": {"url": "http://x/mcp", "headers": {"Authorization": "Bearer literal-secret"}},
            "s": {"command": "x", "env": {"TOKEN": "env-secret"}}
        }}),
        "t",
    )
    .unwrap();
    let text = format!("{c:?}");
    assert!(
        !text.contains("literal-secret") && !text.contains("env-secret"),
        "{text}"
    );
    assert!(
        text.contains("Authorization") && text.contains("TOKEN"),
        "{text}"
    );
}

#[test]
fn servers_start_in_the_directory_of_the_file_that_defines_them() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("config/mcp.json");
    let project = dir.path().join("project/.codemode/mcp.json");
    std::fs::create_dir_all(user.parent().unwrap()).unwrap();
    std::fs::create_dir_all(project.parent().unwrap()).unwrap();
    std::fs::write(
        &user,
        r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "x"]}}}"#,
    )
    .unwrap();
    // An untrusted project cannot move your server (its `cwd` is ignored) nor add one.
    std::fs::write(
        &project,
        r#"{"mcpServers": {"fs": {"command": "npx", "cwd": "."}, "theirs": {"command": "./evil"}}}"#,
    )
    .unwrap();
    let project_dir = dir.path().join("project");
    let (c, w) = McpConfig::load(Some(&user), Some(&project), false).unwrap();
    assert!(!w.is_empty());
    assert_eq!(c.servers().len(), 1);
    let fs = c.server("fs").unwrap();
    assert_eq!(
        fs.start_dir.as_deref(),
        Some(dir.path().join("config").as_path())
    );
    assert_eq!(fs.project_dir.as_deref(), Some(project_dir.as_path()));
    assert!(matches!(
        &fs.transport,
        ServerTransport::Stdio { cwd: None, .. }
    ));

    let (c, _) = McpConfig::load(Some(&user), Some(&project), true).unwrap();
    assert_eq!(
        c.server("theirs").unwrap().start_dir.as_deref(),
        Some(project_dir.as_path()),
        "a trusted project's server starts in the project"
    );
}

#[test]
fn trust_annotations_defaults_on_and_a_project_may_only_turn_it_off() {
    let mut user = base_user();
    user["mcpServers"]["web"]["trustAnnotations"] = json!(false);
    let c = McpConfig::from_json(&user, "user").unwrap();
    assert!(
        c.server("docs").unwrap().trust_annotations,
        "believed unless told"
    );
    assert!(!c.server("web").unwrap().trust_annotations);

    // An untrusted project: turning it off narrows; turning it back on would widen.
    let (c, w) = user_and_project(
        user.clone(),
        json!({"mcpServers": {
            "docs": {"trustAnnotations": false},
            "web": {"trustAnnotations": true}
        }}),
        false,
    );
    assert!(!c.server("docs").unwrap().trust_annotations);
    assert!(!c.server("web").unwrap().trust_annotations, "{w:?}");
    assert!(
        w.iter()
            .any(|m| m.contains("mcpServers.web.trustAnnotations")),
        "{w:?}"
    );
    // A full entry copied into the project is read the same way.
    let mut copy = user.clone();
    copy["mcpServers"]["web"]["trustAnnotations"] = json!(true);
    let (c, _) = user_and_project(user.clone(), copy, false);
    assert!(!c.server("web").unwrap().trust_annotations);

    // A trusted project's override is the user's own word.
    let (c, _) = user_and_project(
        user,
        json!({"mcpServers": {"web": {"trustAnnotations": true}}}),
        true,
    );
    assert!(c.server("web").unwrap().trust_annotations);
}

#[test]
fn trust_annotations_must_be_a_boolean() {
    let dir = tempfile::tempdir().unwrap();
    let user = json!({"mcpServers": {"docs": {"command": "node", "trustAnnotations": "no"}}});
    let (c, problems) =
        McpConfig::load(Some(&write(&dir, "user.json", user)), None, false).unwrap();
    assert!(c.server("docs").is_none(), "a bad entry skips its server");
    assert!(
        problems.iter().any(|p| p.contains("trustAnnotations")),
        "{problems:?}"
    );
}
