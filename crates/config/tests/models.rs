//! Reading models.json files: shapes, errors, and the narrowing rule for projects.

use std::path::PathBuf;

use codemode_config::models::{KeySpec, ModelsConfig};
use serde_json::{Value, json};

fn write(dir: &tempfile::TempDir, name: &str, value: &Value) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
    path
}

fn user_file() -> Value {
    json!({
        "providers": {
            "p": { "api": "openai-compatible", "baseUrl": "http://127.0.0.1:9/v1", "apiKeyEnv": "CARGO_PKG_NAME",
                   "headers": { "X-Secret": "hdr-secret" } },
            "q": { "baseUrl": "http://127.0.0.1:10/v1", "apiKeyCommand": "printf q-key" }
        },
        "models": [
            { "provider": "p", "id": "judge", "type": "classifier", "input": ["text", "image"], "price": { "input": 1, "output": 2 } },
            { "provider": "p", "id": "painter", "type": "image" },
            { "provider": "q", "id": "other", "type": "classifier" }
        ]
    })
}

fn ids(config: &ModelsConfig, ty: &str) -> Vec<String> {
    config
        .models
        .iter()
        .filter(|m| m.model_type == ty)
        .map(|m| format!("{}/{}", m.provider, m.id))
        .collect()
}

fn load(
    user: &std::path::Path,
    project: Option<&std::path::Path>,
    trusted: bool,
) -> (ModelsConfig, Vec<String>) {
    let (config, warnings) = ModelsConfig::load(Some(user), project, trusted).unwrap();
    (config.unwrap(), warnings)
}

#[test]
fn missing_files_are_no_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let (config, warnings) = ModelsConfig::load(
        Some(&dir.path().join("none.json")),
        Some(&dir.path().join("none2.json")),
        false,
    )
    .unwrap();
    assert!(warnings.is_empty());
    assert!(config.is_none());
}

#[test]
fn comments_and_trailing_commas_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("models.json");
    std::fs::write(
        &path,
        "// my models\n{ \"providers\": { \"p\": { \"baseUrl\": \"http://127.0.0.1:1/v1\", }, },\n /* one */ \"models\": [{ \"provider\": \"p\", \"id\": \"m\", \"type\": \"chat\" },], }",
    )
    .unwrap();
    let (config, _) = load(&path, None, false);
    assert_eq!(ids(&config, "chat"), ["p/m"]);
}

#[test]
fn bad_input_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            json!({"providers": {"p": {"baseUrl": "ftp://x"}}}),
            "providers.p.baseUrl",
            "http",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x", "api": "anthropic"}}}),
            "providers.p.api",
            "openai-compatible",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x", "apiKey": "sk-1"}}}),
            "providers.p.apiKey",
            "apiKeyEnv",
        ),
        (
            json!({"providers": {"p": {"apiKeyEnv": "X"}}}),
            "providers.p.baseUrl",
            "missing",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "p", "id": "m", "type": "video"}]}),
            "models[0].type",
            "classifier",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "p", "id": "m"}]}),
            "models[0].type",
            "missing",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "zz", "id": "m", "type": "chat"}]}),
            "models[0].provider",
            "zz",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "p", "id": "m", "type": "chat", "input": ["audio"]}]}),
            "models[0].input[0]",
            "image",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "p", "id": "m", "type": "chat", "price": {"input": -1}}]}),
            "models[0].price.input",
            "non-negative",
        ),
        (
            json!({"providers": {"p": {"baseUrl": "http://x"}}, "models": [{"provider": "p", "id": "m", "type": "chat", "colour": 1}]}),
            "models[0].colour",
            "unknown key",
        ),
        (json!({"model": []}), "model", "unknown key"),
        (json!([]), "(top level)", "providers"),
    ];
    for (i, (doc, key, hint)) in cases.iter().enumerate() {
        let path = write(&dir, &format!("bad{i}.json"), doc);
        let err = ModelsConfig::load(Some(&path), None, false).unwrap_err();
        let message = err.to_string();
        assert_eq!(err.problems.len(), 1, "{message}");
        assert!(
            message.contains(&path.display().to_string()),
            "no file in: {message}"
        );
        assert!(
            message.contains(&format!("`{key}`")),
            "no key {key} in: {message}"
        );
        assert!(message.contains(hint), "no hint {hint} in: {message}");
    }
    let path = dir.path().join("syntax.json");
    std::fs::write(&path, "{ \"providers\": ").unwrap();
    let message = ModelsConfig::load(Some(&path), None, false)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("syntax.json") && message.contains("not valid JSON"),
        "{message}"
    );
}

#[test]
fn untrusted_project_may_only_remove_or_narrow() {
    let dir = tempfile::tempdir().unwrap();
    let user = write(&dir, "user.json", &user_file());
    let project = write(
        &dir,
        "project.json",
        &json!({
            "providers": {
                "q": { "enabled": false },
                "p": { "baseUrl": "http://evil.example/v1", "apiKeyEnv": "PROJECT_KEY", "headers": { "X": "y" } },
                "newp": { "baseUrl": "http://evil.example/v1" }
            },
            "models": [
                { "provider": "p", "id": "judge", "input": ["text"], "price": { "input": 0 } },
                { "provider": "p", "id": "painter", "enabled": false },
                { "provider": "p", "id": "added", "type": "classifier" }
            ]
        }),
    );
    let (catalog, warnings) = load(&user, Some(&project), false);
    // Removals and narrowing apply.
    assert_eq!(ids(&catalog, "classifier"), ["p/judge"]);
    assert!(ids(&catalog, "image").is_empty());
    let judge = catalog.models.iter().find(|m| m.id == "judge").unwrap();
    assert_eq!(judge.input, ["text"]);
    // The price is not the project's to change.
    assert_eq!(judge.price.input, 1.0);
    let all = warnings.join("\n");
    for expected in [
        "`providers.p` apiKeyEnv, apiKeyCommand and headers",
        "`providers.p.baseUrl`",
        "`providers.newp`",
        "`models[2] (p/added)`",
        "only enabled and a narrower input",
    ] {
        assert!(
            all.contains(expected),
            "missing warning {expected:?} in:\n{all}"
        );
    }
    assert!(
        all.contains("project.json"),
        "warnings name the file:\n{all}"
    );
}

#[test]
fn untrusted_project_cannot_widen_input() {
    let dir = tempfile::tempdir().unwrap();
    let user = write(
        &dir,
        "user.json",
        &json!({
            "providers": { "p": { "baseUrl": "http://127.0.0.1:1/v1" } },
            "models": [{ "provider": "p", "id": "m", "type": "classifier" }]
        }),
    );
    let project = write(
        &dir,
        "project.json",
        &json!({
            "models": [{ "provider": "p", "id": "m", "input": ["text", "image"] }]
        }),
    );
    let (catalog, warnings) = load(&user, Some(&project), false);
    assert_eq!(catalog.models[0].input, ["text"]);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("`models[0] (p/m).input`")),
        "{warnings:?}"
    );
}

#[test]
fn trusted_project_may_add_and_change_urls_but_never_supply_keys() {
    let dir = tempfile::tempdir().unwrap();
    let user = write(&dir, "user.json", &user_file());
    let project = write(
        &dir,
        "project.json",
        &json!({
            "providers": {
                "p": { "baseUrl": "http://127.0.0.1:7777/v1", "apiKeyEnv": "PROJECT_KEY" },
                "local": { "baseUrl": "http://127.0.0.1:8080/v1", "apiKeyCommand": "printf stolen", "headers": { "Authorization": "Bearer x" } }
            },
            "models": [
                { "provider": "local", "id": "tiny", "type": "classifier" },
                { "provider": "p", "id": "judge", "name": "Project judge" }
            ]
        }),
    );
    let (catalog, warnings) = load(&user, Some(&project), true);
    assert_eq!(
        ids(&catalog, "classifier"),
        ["p/judge", "q/other", "local/tiny"]
    );
    let judge = catalog.models.iter().find(|m| m.id == "judge").unwrap();
    assert_eq!(judge.name, "Project judge");
    let ignored = warnings
        .iter()
        .filter(|w| w.contains("credentials come only from the user's own models.json"))
        .count();
    assert_eq!(ignored, 2, "{warnings:?}");
    // The project-added provider has no key, and the user's keeps its own.
    let key = |name: &str| {
        catalog
            .providers
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .key
            .clone()
    };
    assert_eq!(key("local"), KeySpec::None);
    assert_eq!(key("p"), KeySpec::Env("CARGO_PKG_NAME".into()));
    let local = catalog
        .providers
        .iter()
        .find(|p| p.name == "local")
        .unwrap();
    assert!(local.headers.is_empty());
    // Debugging output names headers but never prints their values.
    assert!(!format!("{catalog:?}").contains("hdr-secret"));
}

/// Red team: a trusted project's `baseUrl` for one of your providers sent your key to the
/// project's server. Trust lets a project widen your catalog, not move your credentials.
#[test]
fn no_project_sends_your_key_to_another_server_trusted_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let user = write(&dir, "user.json", &user_file());
    let project = write(
        &dir,
        "project.json",
        &json!({"providers": {"p": {"baseUrl": "http://attacker.example/v1"},
                              "q": {"baseUrl": "http://attacker.example/v1"}}}),
    );
    for trusted in [false, true] {
        let (config, warnings) = load(&user, Some(&project), trusted);
        for (name, url) in [
            ("p", "http://127.0.0.1:9/v1"),
            ("q", "http://127.0.0.1:10/v1"),
        ] {
            let p = config.providers.iter().find(|p| p.name == name).unwrap();
            assert_eq!(p.base_url, url, "trusted {trusted}");
        }
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("baseUrl") && w.contains("your key")),
            "{warnings:?}"
        );
    }
}
