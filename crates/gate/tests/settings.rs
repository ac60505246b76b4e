//! Settings files, the narrowing rule and project trust.

mod common;

use std::path::Path;
use std::sync::Arc;

use codemode_gate::settings::{self, SettingsError, SettingsPaths};
use codemode_gate::{Gate, PolicyError, Registry, Stage};
use codemode_spec::{CodemodeMode, Exposure};
use common::*;
use serde_json::{Value, json};

struct Dirs {
    _tmp: tempfile::TempDir,
    paths: SettingsPaths,
    project: std::path::PathBuf,
}

fn dirs(user: Value, project: Option<Value>) -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let user_dir = tmp.path().join("config/codemode");
    let project_dir = tmp.path().join("project");
    std::fs::create_dir_all(&user_dir).unwrap();
    std::fs::create_dir_all(project_dir.join(".codemode")).unwrap();
    std::fs::write(user_dir.join("settings.json"), user.to_string()).unwrap();
    if let Some(p) = project {
        std::fs::write(settings::project_file(&project_dir), p.to_string()).unwrap();
    }
    Dirs {
        paths: SettingsPaths::new(user_dir),
        project: project_dir,
        _tmp: tmp,
    }
}

fn user_settings() -> Value {
    json!({
        "limits": {"timeout_ms": 30000, "heap_bytes": 268435456},
        "mode": "only",
        "budgets": {"script": {"max_calls": 100}, "session": {"max_cost_usd": 1.0}},
        "tools": {"bash": {"disabled": true}, "mcp__gh__*": {"exposure": "deferred"}},
        "models": {"enabled": true, "allow": ["acme/small"]},
        "audit": {"path": "/var/log/codemode.jsonl"}
    })
}

fn widening_project() -> Value {
    json!({
        "limits": {"timeout_ms": 999999, "heap_bytes": 1000},
        "mode": "on",
        "budgets": {"script": {"max_calls": 1000}},
        "tools": {"bash": {"disabled": false}, "mcp__gh__search": {"exposure": "direct"}, "read": {"exposure": "hidden"}},
        "models": {"allow": ["acme/small", "acme/big"]},
        "audit": {"path": "/tmp/elsewhere.jsonl"},
        "hooks": {"PreToolUse": [{"matcher": "", "hooks": [{"type": "command", "command": "true"}]}]}
    })
}

fn registry() -> Registry {
    let reg = Registry::new();
    for t in [
        TestTool::new("bash", object_schema()).exposure(Exposure::Direct),
        TestTool::new("read", object_schema()).read_only(),
        TestTool::new("mcp__gh__search", object_schema()),
    ] {
        reg.register(Arc::new(t)).unwrap();
    }
    reg
}

fn exposure_of(reg: &Registry, name: &str) -> Exposure {
    reg.specs()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap()
        .exposure
}

#[test]
fn an_untrusted_project_cannot_widen_but_may_narrow() {
    let d = dirs(user_settings(), Some(widening_project()));
    let eff = settings::load(&d.paths, Some(&d.project)).unwrap();
    assert!(!eff.trusted);
    let s = &eff.settings;
    assert_eq!(s.limits.timeout_ms, Some(30000), "raise ignored");
    assert_eq!(s.limits.heap_bytes, Some(1000), "lowering taken");
    assert_eq!(s.mode, Some(CodemodeMode::Only));
    assert_eq!(s.budgets.script.max_calls, Some(100));
    assert_eq!(s.models.allow, Some(vec!["acme/small".to_string()]));
    assert_eq!(
        s.audit.path.as_deref(),
        Some(Path::new("/var/log/codemode.jsonl"))
    );
    assert!(s.hooks.is_empty());
    let warnings = eff.warnings.join("\n");
    for key in [
        "limits.timeout_ms",
        "mode",
        "budgets.script.max_calls",
        "models.allow",
        "audit.path",
        "hooks",
    ] {
        assert!(
            warnings.contains(&format!("`{key}`")),
            "no warning for {key}:\n{warnings}"
        );
    }
    assert!(!warnings.contains("limits.heap_bytes"), "{warnings}");
    assert!(
        warnings.contains("settings.json"),
        "warnings name the file: {warnings}"
    );

    let reg = registry();
    let tool_warnings = eff.apply_tools(&reg).join("\n");
    assert_eq!(
        exposure_of(&reg, "bash"),
        Exposure::Hidden,
        "cannot re-enable a disabled tool"
    );
    assert_eq!(
        exposure_of(&reg, "mcp__gh__search"),
        Exposure::Deferred,
        "cannot make a tool more visible"
    );
    assert_eq!(
        exposure_of(&reg, "read"),
        Exposure::Hidden,
        "may hide a tool"
    );
    assert!(
        tool_warnings.contains("`tools.bash.disabled`"),
        "{tool_warnings}"
    );
    assert!(
        tool_warnings.contains("`tools.mcp__gh__search.exposure`"),
        "{tool_warnings}"
    );
    // Applying again gives the same result (rules start from each tool's declared exposure).
    eff.apply_tools(&reg);
    assert_eq!(exposure_of(&reg, "bash"), Exposure::Hidden);
    assert_eq!(exposure_of(&reg, "read"), Exposure::Hidden);
}

#[test]
fn a_trusted_project_may_widen() {
    let d = dirs(user_settings(), Some(widening_project()));
    assert!(!settings::is_trusted(&d.paths, &d.project));
    settings::trust(&d.paths, &d.project).unwrap();
    assert!(settings::is_trusted(&d.paths, &d.project));
    // Trust follows the real directory, not the spelling of the path.
    let alias = d.project.parent().unwrap().join("alias");
    std::os::unix::fs::symlink(&d.project, &alias).unwrap();
    assert!(settings::is_trusted(&d.paths, &alias));

    let eff = settings::load(&d.paths, Some(&d.project)).unwrap();
    assert!(eff.trusted);
    assert_eq!(eff.settings.limits.timeout_ms, Some(999999));
    assert_eq!(eff.settings.mode, Some(CodemodeMode::On));
    assert_eq!(eff.settings.hooks.pre_tool_use.len(), 1);
    assert!(eff.warnings.is_empty(), "{:?}", eff.warnings);
    let reg = registry();
    assert!(eff.apply_tools(&reg).is_empty());
    assert_eq!(
        exposure_of(&reg, "bash"),
        Exposure::Direct,
        "a trusted project may re-enable"
    );
    assert_eq!(exposure_of(&reg, "mcp__gh__search"), Exposure::Direct);

    settings::untrust(&d.paths, &d.project).unwrap();
    assert!(!settings::is_trusted(&d.paths, &d.project));
}

#[test]
fn unknown_keys_are_errors_naming_key_and_file() {
    let d = dirs(json!({"limits": {"timeout": 5}}), None);
    let err = settings::load(&d.paths, None).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SettingsError::Parse { .. }));
    assert!(
        msg.contains("`timeout`") && msg.contains("settings.json"),
        "{msg}"
    );

    let d = dirs(json!({}), Some(json!({"budget": {}})));
    let msg = settings::load(&d.paths, Some(&d.project))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`budget`") && msg.contains(".codemode"),
        "{msg}"
    );

    let d = dirs(json!({"tools": {"a[": {"disabled": true}}}), None);
    assert!(matches!(
        settings::load(&d.paths, None),
        Err(SettingsError::Pattern { .. })
    ));
}

#[test]
fn missing_files_mean_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = SettingsPaths::new(tmp.path().join("none"));
    let eff = settings::load(&paths, Some(tmp.path())).unwrap();
    assert_eq!(eff.settings, settings::Settings::default());
    assert_eq!(
        eff.load_policies().unwrap().ids(),
        [
            "read-only-tools-in-workspace",
            "ask-reads-outside-workspace",
            "ask-writes"
        ]
    );
}

#[tokio::test]
async fn untrusted_project_policies_may_only_forbid() {
    let d = dirs(json!({}), Some(json!({"policy": ["extra.cedar"]})));
    let extra = d.project.join("extra.cedar");
    std::fs::write(
        &extra,
        "@id(\"everything\") permit(principal, action, resource);\n",
    )
    .unwrap();
    let eff = settings::load(&d.paths, Some(&d.project)).unwrap();
    assert_eq!(eff.policy_files[0].path, extra, "relative to the project");
    assert!(matches!(
        eff.load_policies(),
        Err(PolicyError::NotForbidOnly { .. })
    ));

    std::fs::write(
        &extra,
        "@id(\"no-read\") forbid(principal, action, resource == Tool::\"read\");\n",
    )
    .unwrap();
    let set = eff.load_policies().unwrap();
    assert_eq!(
        set.ids(),
        [
            "read-only-tools-in-workspace",
            "ask-reads-outside-workspace",
            "ask-writes",
            "no-read"
        ]
    );
    let gate = Gate::builder()
        .registry(registry())
        .policy(set)
        .build()
        .unwrap();
    let err = gate
        .call(req("read", json!({}), script("p")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert_eq!(err.policy_ids, ["no-read"]);
}

#[test]
fn user_policy_paths_are_relative_to_the_config_dir() {
    let d = dirs(json!({"policy": ["mine.cedar"]}), None);
    std::fs::write(
        d.paths.user_dir.join("mine.cedar"),
        "@id(\"mine\") permit(principal, action, resource);",
    )
    .unwrap();
    let eff = settings::load(&d.paths, None).unwrap();
    assert_eq!(eff.load_policies().unwrap().ids(), ["mine"]);
}

#[tokio::test]
async fn configure_turns_settings_into_a_gate() {
    let user = json!({
        "mode": "only",
        "budgets": {"script": {"max_calls": 1}},
        "tools": {"mcp__gh__*": {"exposure": "deferred"}},
        "models": {"allow": ["acme/small"]},
        "audit": {"path": "logs/audit.jsonl"},
        "policy": ["all.cedar"]
    });
    let d = dirs(user, Some(json!({"models": {"enabled": false}})));
    std::fs::write(
        d.paths.user_dir.join("all.cedar"),
        "@id(\"all\") permit(principal, action, resource);",
    )
    .unwrap();
    // Relative audit paths are taken as given (relative to the working directory); use an absolute one here.
    let audit_path = d.paths.user_dir.join("logs/audit.jsonl");
    let mut eff = settings::load(&d.paths, Some(&d.project)).unwrap();
    eff.settings.audit.path = Some(audit_path.clone());
    let reg = registry();
    reg.register(Arc::new(TestTool::model(
        "models.classify",
        "acme",
        "small",
        Default::default(),
    )))
    .unwrap();
    let (builder, warnings) = eff.configure(Gate::builder(), &reg).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let gate = builder.build().unwrap();
    assert_eq!(gate.mode(), CodemodeMode::Only);
    assert_eq!(
        exposure_of(gate.registry(), "mcp__gh__search"),
        Exposure::Deferred
    );

    let err = gate
        .call(req("bash", json!({}), model_origin()))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve, "only mode");
    let err = gate
        .call(req("models.classify", json!({"text": "x"}), script("cfg")))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("models.enabled"),
        "project turned models off: {}",
        err.message
    );
    gate.call(req("read", json!({}), script("cfg")))
        .await
        .unwrap();
    let err = gate
        .call(req("read", json!({}), script("cfg")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Budget);
    // Settings open the log with the user's key, kept in the user's state directory.
    let key =
        codemode_gate::AuditKey::load(&codemode_gate::AuditKey::default_path().unwrap()).unwrap();
    assert_eq!(
        codemode_gate::verify(&audit_path, Some(&key))
            .unwrap()
            .lines,
        4
    );
}

#[tokio::test]
async fn models_allow_list_is_enforced_by_the_gate() {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::model(
        "models.a",
        "acme",
        "small",
        Default::default(),
    )))
    .unwrap();
    reg.register(Arc::new(TestTool::model(
        "models.b",
        "acme",
        "big",
        Default::default(),
    )))
    .unwrap();
    let gate = builder(&reg)
        .models(settings::ModelsSettings {
            enabled: None,
            allow: Some(vec!["acme/small".into()]),
        })
        .build()
        .unwrap();
    gate.call(req("models.a", json!({"text": "x"}), script("m")))
        .await
        .unwrap();
    let err = gate
        .call(req("models.b", json!({"text": "x"}), script("m")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert!(
        err.message.contains("`acme/big` is not in `models.allow`"),
        "{}",
        err.message
    );
}
