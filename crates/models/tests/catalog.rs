//! The catalog: what scripts see of it and which credentials it can use now. Reading and merging
//! models.json files is `codemode-config`'s (its `tests/models.rs`).

use codemode_models::Catalog;
use serde_json::{Value, json};

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
    let catalog = Catalog::from_json(&user_file()).unwrap();
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
    // A key command is not run to list models (a script may list them without the gate's
    // leave): it counts as available, and a call finds out whether it prints a key.
    assert_eq!(
        ids(&catalog.available_of_type("classifier").unwrap()),
        [
            "env_set/a",
            "cmd_ok/c",
            "cmd_fails/d",
            "cmd_empty/e",
            "keyless/f"
        ]
    );
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
