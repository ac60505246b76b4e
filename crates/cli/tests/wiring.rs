//! The command line wires the user's settings into the gate: hooks, budgets and the model
//! catalog, each checked through a real `codemode run`.

use std::path::Path;

use serde_json::{Value, json};

use crate::common;

fn run(
    config: &Path,
    work: &Path,
    script: &str,
    env: &[(&str, &str)],
) -> (Option<i32>, Value, String) {
    let mut cmd = common::codemode();
    cmd.args(["run", "--json", "--config-dir"])
        .arg(config)
        .arg("--workdir")
        .arg(work)
        .arg("-");
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::json_outcome(common::pipe(cmd, Some(script)))
}

#[test]
fn a_command_hook_from_the_settings_blocks_a_call() {
    let config = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("secret.txt"), "s3cret").unwrap();
    let hook = config.path().join("deny-secret.sh");
    std::fs::write(
        &hook,
        "#!/bin/sh\nif grep -q secret; then echo 'secret files stay closed' >&2; exit 2; fi\nexit 0\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&hook)
        .status()
        .unwrap();
    let settings = json!({ "hooks": { "PreToolUse": [
        { "matcher": "read", "hooks": [{ "type": "command", "command": hook, "timeout": 10 }] }
    ]}});
    std::fs::write(config.path().join("settings.json"), settings.to_string()).unwrap();
    let script = r#"let a, b;
        try { await tools.read({ path: "secret.txt" }); a = "read" } catch (e) { a = e.message }
        b = (await tools.ls({})).entries.some((e) => e.name === "secret.txt");
        return { a, b }"#;
    let (code, v, stderr) = run(config.path(), work.path(), script, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        v["value"]["a"]
            .as_str()
            .unwrap()
            .contains("secret files stay closed"),
        "{v}"
    );
    assert_eq!(
        v["value"]["b"], true,
        "calls the hook does not match still run"
    );
}

#[test]
fn a_script_budget_from_the_settings_refuses_the_third_call() {
    let config = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let settings = json!({ "budgets": { "script": { "max_calls": 2 } } });
    std::fs::write(config.path().join("settings.json"), settings.to_string()).unwrap();
    let script = r#"const out = [];
        for (let i = 0; i < 3; i++) { try { await tools.ls({}); out.push("ok") } catch (e) { out.push(e.message) } }
        return out"#;
    let (code, v, stderr) = run(config.path(), work.path(), script, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let out = v["value"].as_array().unwrap();
    assert_eq!(out[0], "ok");
    assert_eq!(out[1], "ok");
    assert!(out[2].as_str().unwrap().contains("max_calls"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_from_the_catalog_are_gated_and_their_usage_is_printed() {
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    let config = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let catalog = json!({
        "providers": { "p": { "api": "openai-compatible", "baseUrl": provider.base_url(), "apiKeyEnv": "CODEMODE_TEST_KEY" } },
        "models": [{ "provider": "p", "id": "judge", "type": "classifier", "input": ["text"], "price": { "input": 1.0, "output": 4.0 } }]
    });
    std::fs::write(config.path().join("models.json"), catalog.to_string()).unwrap();
    let policy = config.path().join("models.cedar");
    std::fs::write(&policy, "@id(\"classifiers\")\npermit (principal, action == Action::\"model_call\", resource is Model)\nwhen { resource.type == \"classifier\" };\n").unwrap();
    std::fs::write(
        config.path().join("settings.json"),
        json!({ "policy": [policy] }).to_string(),
    )
    .unwrap();
    let script = r#"const m = await models.getModelOfType("classifier", "p", "judge");
        const r = await models.classify({ ...m, baseUrl: "http://127.0.0.1:9/evil" },
          { state: { text: "great" }, questions: { mood: { type: "bool", instructions: "Happy?", criteria: { true: "yes", false: "no" } } } });
        return r.stopReason"#;
    let (code, v, stderr) = tokio::task::spawn_blocking({
        let (c, w) = (config.path().to_path_buf(), work.path().to_path_buf());
        move || run(&c, &w, script, &[("CODEMODE_TEST_KEY", "k-123")])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{v}\n{stderr}");
    assert_eq!(v["value"], "stop", "{v}");
    assert_eq!(v["usage"]["inputTokens"], 100, "{v}");
    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].authorization.as_deref(), Some("Bearer k-123"));
    // Without the permit, the default policy denies model calls.
    std::fs::write(config.path().join("settings.json"), "{}").unwrap();
    let (_, v, _) = tokio::task::spawn_blocking({
        let (c, w) = (config.path().to_path_buf(), work.path().to_path_buf());
        move || {
            run(&c, &w, "try { await models.classify({ provider: \"p\", id: \"judge\" }, { state: {}, questions: { q: { type: \"bool\", instructions: \"?\", criteria: { true: \"y\", false: \"n\" } } } }) } catch (e) { return e.message }", &[("CODEMODE_TEST_KEY", "k-123")])
        }
    })
    .await
    .unwrap();
    assert!(
        v["value"]
            .as_str()
            .unwrap_or_default()
            .contains("no policy permits"),
        "{v}"
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "the denied call never reached the provider"
    );
}
