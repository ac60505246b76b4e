//! Loading models.json files: shapes, errors, the narrowing rule and what scripts see.

use std::path::PathBuf;

use codemode_models::{Catalog, ModelsError};
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

fn ids(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["provider"].as_str().unwrap(),
                e["id"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn loads_user_file_and_lists_models_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let user = write(&dir, "user.json", &user_file());
    let (catalog, warnings) = Catalog::load(Some(&user), None, false).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(
        ids(&catalog.models_of_type("classifier").unwrap()),
        ["p/judge", "q/other"]
    );
    assert_eq!(
        ids(&catalog.models_of_type("image").unwrap()),
        ["p/painter"]
    );
    assert!(catalog.models_of_type("chat").unwrap().is_empty());
    let judge = catalog
        .model_of_type("classifier", "p", "judge")
        .unwrap()
        .unwrap();
    assert_eq!(judge["name"], "judge", "name defaults to the id");
    assert_eq!(judge["input"], json!(["text", "image"]));
    assert_eq!(judge["price"]["output"], 2.0);
    assert!(
        catalog
            .model_of_type("classifier", "p", "nope")
            .unwrap()
            .is_none()
    );
    assert!(
        catalog
            .model_of_type("image", "p", "judge")
            .unwrap()
            .is_none(),
        "wrong type"
    );
}

#[test]
fn missing_files_are_an_empty_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, warnings) = Catalog::load(
        Some(&dir.path().join("none.json")),
        Some(&dir.path().join("none2.json")),
        false,
    )
    .unwrap();
    assert!(warnings.is_empty());
    assert!(catalog.models_of_type("classifier").unwrap().is_empty());
}

#[test]
fn script_entries_carry_no_url_key_or_headers() {
    let catalog = Catalog::from_json(&user_file()).unwrap();
    for ty in ["classifier", "image", "chat"] {
        for entry in catalog.models_of_type(ty).unwrap() {
            let text = entry.to_string();
            for secret in [
                "127.0.0.1",
                "baseUrl",
                "headers",
                "hdr-secret",
                "apiKey",
                "CARGO_PKG_NAME",
                "printf",
            ] {
                assert!(!text.contains(secret), "{secret} leaked into {text}");
            }
            let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
            assert_eq!(
                keys,
                ["type", "provider", "id", "name", "api", "input", "price"]
            );
        }
    }
}

#[test]
fn available_depends_on_the_credential() {
    let catalog = Catalog::from_json(&json!({
        "providers": {
            "env_set": { "baseUrl": "http://127.0.0.1:1/v1", "apiKeyEnv": "CARGO_PKG_NAME" },
            "env_unset": { "baseUrl": "http://127.0.0.1:1/v1", "apiKeyEnv": "CODEMODE_TEST_SURELY_UNSET_7Q3" },
            "cmd_ok": { "baseUrl": "http://127.0.0.1:1/v1", "apiKeyCommand": "printf 'k-123\\n'" },
            "cmd_fails": { "baseUrl": "http://127.0.0.1:1/v1", "apiKeyCommand": "exit 3" },
            "cmd_empty": { "baseUrl": "http://127.0.0.1:1/v1", "apiKeyCommand": "true" },
            "keyless": { "baseUrl": "http://127.0.0.1:1/v1" }
        },
        "models": [
            { "provider": "env_set", "id": "a", "type": "classifier" },
            { "provider": "env_unset", "id": "b", "type": "classifier" },
            { "provider": "cmd_ok", "id": "c", "type": "classifier" },
            { "provider": "cmd_fails", "id": "d", "type": "classifier" },
            { "provider": "cmd_empty", "id": "e", "type": "classifier" },
            { "provider": "keyless", "id": "f", "type": "classifier" }
        ]
    }))
    .unwrap();
    assert_eq!(catalog.models_of_type("classifier").unwrap().len(), 6);
    assert_eq!(
        ids(&catalog.available_of_type("classifier").unwrap()),
        ["env_set/a", "cmd_ok/c", "keyless/f"]
    );
    // The command's key is cached now; debugging output must not show it.
    assert!(!format!("{catalog:?}").contains("k-123"));
}

#[test]
fn unknown_type_is_refused_with_the_valid_types() {
    let catalog = Catalog::from_json(&user_file()).unwrap();
    for result in [
        catalog.models_of_type("video").map(|_| ()),
        catalog.available_of_type("video").map(|_| ()),
        catalog.model_of_type("video", "p", "judge").map(|_| ()),
    ] {
        let message = result.unwrap_err().to_string();
        assert!(
            message.contains("\"video\"") && message.contains("classifier"),
            "{message}"
        );
    }
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
        let err = Catalog::load(Some(&path), None, false).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ModelsError::Invalid { .. }), "{message}");
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
    let message = Catalog::load(Some(&path), None, false)
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
    let (catalog, warnings) = Catalog::load(Some(&user), Some(&project), false).unwrap();
    // Removals and narrowing apply.
    assert_eq!(
        ids(&catalog.models_of_type("classifier").unwrap()),
        ["p/judge"]
    );
    assert!(catalog.models_of_type("image").unwrap().is_empty());
    let judge = catalog.model("p", "judge").unwrap();
    assert_eq!(judge.input, ["text"]);
    // The price is not the project's to change.
    assert_eq!(judge.price.input, 1.0);
    let all = warnings.join("\n");
    for expected in [
        "apiKeyEnv, apiKeyCommand and headers are ignored",
        "baseUrl ignored",
        "providers.newp not added",
        "p/added) not added",
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
    let (catalog, warnings) = Catalog::load(Some(&user), Some(&project), false).unwrap();
    assert_eq!(catalog.model("p", "m").unwrap().input, ["text"]);
    assert!(
        warnings.iter().any(|w| w.contains("not widened")),
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
    let (catalog, warnings) = Catalog::load(Some(&user), Some(&project), true).unwrap();
    assert_eq!(
        ids(&catalog.models_of_type("classifier").unwrap()),
        ["p/judge", "q/other", "local/tiny"]
    );
    assert_eq!(catalog.model("p", "judge").unwrap().name, "Project judge");
    let ignored = warnings
        .iter()
        .filter(|w| w.contains("credentials come only from the user"))
        .count();
    assert_eq!(ignored, 2, "{warnings:?}");
    // The project-added provider has no key: it is usable only if it needs none.
    assert_eq!(
        ids(&catalog.available_of_type("classifier").unwrap()),
        ["p/judge", "q/other", "local/tiny"]
    );
}

#[test]
fn restrict_turns_models_off_or_keeps_the_allowed() {
    let mut catalog = Catalog::from_json(&user_file()).unwrap();
    catalog.restrict(
        true,
        Some(&["p/painter".to_string(), "q/other".to_string()]),
    );
    assert_eq!(
        ids(&catalog.models_of_type("classifier").unwrap()),
        ["q/other"]
    );
    assert_eq!(
        ids(&catalog.models_of_type("image").unwrap()),
        ["p/painter"]
    );
    assert!(catalog.is_enabled());
    catalog.restrict(false, None);
    assert!(!catalog.is_enabled());
    assert!(catalog.models_of_type("image").unwrap().is_empty());
}
