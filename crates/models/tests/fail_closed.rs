//! Model calls fail closed on what they cost: a provider that reports no usage, zero or negative
//! tokens is charged codemode's own count; the reservation bounds what a request can cost; a
//! call cut off after its request went out is cancelled with an unknown effect; a provider's
//! error text never carries the key.

mod common;

use std::time::Duration;

use codemode_spec::{Effect, ToolErrorKind};
use common::*;
use serde_json::{Value, json};

fn args_with_state(text: &str) -> Value {
    json!({"model": judge(), "context": {
        "state": { "text": text },
        "questions": { "s": { "type": "choice", "instructions": "x", "criteria": { "a": "a", "b": "b" } } }
    }})
}

type SetKnobs = Box<dyn Fn(&mut codemode_models::testing::Knobs)>;

/// One question: `max_tokens` is 16 + 12.
const MAX_OUTPUT: u64 = 28;

#[tokio::test]
async fn missing_zero_or_negative_usage_is_charged_codemodes_count() {
    let f = fixture().await;
    let args = args_with_state(&"x".repeat(4000));
    let cases: [(&str, SetKnobs); 3] = [
        ("missing", Box::new(|k| k.usage = None)),
        ("zero", Box::new(|k| k.usage = Some((0, 0)))),
        (
            "negative",
            Box::new(|k| {
                k.raw_usage =
                    Some(json!({ "prompt_tokens": -1_000_000, "completion_tokens": -1_000_000 }))
            }),
        ),
    ];
    for (name, knob) in cases {
        f.provider.configure(|k| knob(k));
        let out = gated(&f.classify, args.clone()).await.unwrap();
        assert_eq!(out.value["stopReason"], "stop", "{name}: {}", out.value);
        let usage = out.usage.expect("a call that ran always has usage");
        // 4000 ASCII bytes of state alone are 1000 tokens at four bytes a token.
        assert!(usage.input_tokens >= 1000, "{name}: {usage:?}");
        assert_eq!(usage.output_tokens, MAX_OUTPUT, "{name}");
        // $1 / M input, $4 / M output.
        assert!(
            usage.cost_usd >= (1000.0 + 4.0 * 28.0) / 1e6,
            "{name}: {usage:?}"
        );
        assert!(usage.estimated, "{name}");
        assert_eq!(out.value["usage"]["estimated"], true, "{name}");
    }
}

#[tokio::test]
async fn a_plausible_report_is_charged_as_reported() {
    let f = fixture().await;
    f.provider.configure(|k| k.usage = Some((1000, 5)));
    let out = gated(&f.classify, args_with_state(&"x".repeat(4000)))
        .await
        .unwrap();
    let usage = out.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 5));
    assert!(!usage.estimated);
    assert!(out.value["usage"].get("estimated").is_none());
}

#[tokio::test]
async fn the_reservation_bounds_cjk_input_by_its_bytes() {
    let f = fixture().await;
    let text = "漢".repeat(2000);
    let facts = f.classify.facts(&args_with_state(&text)).unwrap();
    let model = facts.model.unwrap();
    // Three UTF-8 bytes per character, and no tokenizer makes a token of less than one byte.
    assert!(model.max_input_tokens >= 6000, "{model:?}");
    assert_eq!(model.max_output_tokens, MAX_OUTPUT);
    // A provider counting one token per character of the whole request stays under the bound.
    let sent = f.provider.requests();
    assert!(sent.is_empty());
    f.provider.configure(|k| k.usage = None);
    let out = gated(&f.classify, args_with_state(&text)).await.unwrap();
    let body = f.provider.requests()[0].body.to_string();
    assert!(body.chars().count() as u64 <= model.max_input_tokens);
    let usage = out.usage.unwrap();
    assert!(usage.input_tokens >= 2000 && usage.input_tokens <= model.max_input_tokens);
}

#[tokio::test]
async fn a_call_cancelled_after_its_request_went_out_is_cancelled_with_unknown_effect() {
    let f = fixture().await;
    f.provider.configure(|k| k.delay = Duration::from_secs(30));
    let call = script_call(args_with_state("hi"), "s");
    let cancel = call.cancel.clone();
    let result = cancel_once_sent(&f.provider, cancel, f.classify.call(call)).await;
    let e = result.expect_err("a cancelled model call is not a result");
    assert_eq!(e.kind, ToolErrorKind::Cancelled);
    assert_eq!(e.effect, Effect::Unknown, "the provider may bill it");
}

#[tokio::test]
async fn a_call_cancelled_before_it_started_has_no_effect() {
    let f = fixture().await;
    let call = script_call(args_with_state("hi"), "s");
    call.cancel.cancel();
    let e = f.classify.call(call).await.unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::Cancelled);
    assert!(f.provider.requests().is_empty());
}

#[tokio::test]
async fn an_echoed_key_never_reaches_the_result() {
    let f = fixture().await;
    f.provider.configure(|k| {
        k.status = Some(401);
        k.echo_authorization = true;
    });
    let out = gated(&f.classify, args_with_state("hi")).await.unwrap();
    let message = out.value["errorMessage"].as_str().unwrap();
    assert!(
        f.provider.requests()[0]
            .authorization
            .as_deref()
            .is_some_and(|a| a.contains(KEY)),
        "the key was sent"
    );
    assert!(message.contains("answered HTTP 401"), "{message}");
    assert!(!message.contains(KEY), "{message}");
    assert!(message.contains("Bearer [redacted]"), "{message}");
    let out = gated(
        &f.images,
        json!({"model": painter(), "context": {"input": [{"type": "text", "text": "fox"}]}}),
    )
    .await
    .unwrap();
    assert!(!out.value.to_string().contains(KEY), "{}", out.value);
}

/// Red team: the error body was cut to 300 characters before the key was redacted, so a key
/// the cut split in two passed in part (`…key was sk-SECRETKE`).
#[tokio::test]
async fn a_key_cut_by_the_message_limit_is_not_shown_in_part() {
    let f = fixture().await;
    // Every cut through the key, at either limit (the old 300 characters, the message's 400).
    for padding in (250..300).chain(360..400) {
        f.provider.configure(|k| {
            k.status = Some(401);
            k.echo_key_after = Some(padding);
        });
        let out = gated(&f.classify, args_with_state("hi")).await.unwrap();
        let message = out.value["errorMessage"].as_str().unwrap();
        for prefix_len in 6..=KEY.len() {
            assert!(
                !message.contains(&KEY[..prefix_len]),
                "padding {padding}: part of the key: {message}"
            );
        }
    }
}

/// Red team: `"apiKeyCommand": "./key.sh"` ran in the directory codemode was started in, the
/// project, so a project's `key.sh` ran with your authority and its key was sent. A relative
/// command is yours, beside your models.json; and listing models runs no command at all.
#[tokio::test]
async fn a_key_command_runs_beside_your_models_file_and_only_for_a_call() {
    use std::os::unix::fs::PermissionsExt;
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let key_sh = dir.path().join("key.sh");
    std::fs::write(
        &key_sh,
        format!(
            "#!/bin/sh\necho x >> '{}'\nprintf user-key-123456\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&key_sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("models.json");
    let mut models = catalog_json(&provider.base_url());
    models["providers"]["p"] = json!({"baseUrl": provider.base_url(), "apiKeyCommand": "./key.sh"});
    std::fs::write(&file, models.to_string()).unwrap();
    let catalog = user_catalog(&file);
    assert_eq!(catalog.available_of_type("classifier").unwrap().len(), 2);
    assert!(!ran.exists(), "listing models ran the key command");
    let out = gated(&classify_of(catalog), args_with_state("hi"))
        .await
        .unwrap();
    assert!(out.value["errorMessage"].is_null(), "{}", out.value);
    let sent = provider.requests()[0]
        .authorization
        .clone()
        .unwrap_or_default();
    assert!(sent.contains("user-key-123456"), "{sent}");
    assert!(ran.exists());
}

/// Red team: a confined `bash` can still write `~/.local/bin`, which comes before `/usr/bin` on
/// many users' PATH. A program it left there under the name a key command uses ran unconfined,
/// with the user's authority, at the next model call. A key command now finds programs only in
/// directories that programs codemode starts cannot change. Run as an ordinary user (`nobody`
/// in a child process when the tests run as root: root can change every directory).
#[tokio::test]
async fn a_key_command_never_runs_a_program_planted_ahead_of_it_on_path() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const CHILD: &str = "CODEMODE_TEST_PLANTED_KEY_DIR";
    if let Some(dir) = std::env::var_os(CHILD) {
        return planted_key_command_child(std::path::Path::new(&dir)).await;
    }
    // A directory the child's user can write, on its PATH ahead of /usr/bin, holding a
    // `printenv` that would print a key of its choosing.
    let dir = tempfile::tempdir().unwrap();
    let planted = dir.path().join("bin");
    std::fs::create_dir(&planted).unwrap();
    let fake = planted.join("printenv");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ntouch '{}'\nprintf stolen-key-0000\n",
            dir.path().join("ran").display()
        ),
    )
    .unwrap();
    for (path, mode) in [
        (dir.path(), 0o777),
        (planted.as_path(), 0o777),
        (&fake, 0o755),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "a_key_command_never_runs_a_program_planted_ahead_of_it_on_path",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, dir.path())
        .env("PATH", format!("{}:/usr/bin:/bin", planted.display()));
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        child.uid(65534).gid(65534).env("HOME", dir.path());
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SENT "))
        .expect("the child reports what it sent");
    assert!(sent.contains("the-real-key-4821"), "{sent}");
    assert!(!dir.path().join("ran").exists(), "the planted program ran");
}

async fn planted_key_command_child(dir: &std::path::Path) {
    let provider = codemode_models::testing::TestProvider::start()
        .await
        .unwrap();
    let file = dir.join("models.json");
    let mut models = catalog_json(&provider.base_url());
    models["providers"]["p"] = json!({
        "baseUrl": provider.base_url(),
        "apiKeyCommand": "KEY=the-real-key-4821 printenv KEY"
    });
    std::fs::write(&file, models.to_string()).unwrap();
    let out = gated(&classify_of(user_catalog(&file)), args_with_state("hi"))
        .await
        .unwrap();
    let sent = provider
        .requests()
        .first()
        .and_then(|r| r.authorization.clone())
        .unwrap_or_default();
    println!("SENT {sent} ({})", out.value);
}

/// The catalog of a user's models.json, as codemode loads it (no project file).
fn user_catalog(file: &std::path::Path) -> std::sync::Arc<codemode_models::Catalog> {
    let (config, _) = codemode_config::models::ModelsConfig::load(Some(file), None, false).unwrap();
    std::sync::Arc::new(codemode_models::Catalog::new(&config.unwrap()))
}

fn classify_of(
    catalog: std::sync::Arc<codemode_models::Catalog>,
) -> std::sync::Arc<dyn codemode_spec::Tool> {
    codemode_models::model_tools(catalog, codemode_models::ModelsHttpConfig::default())
        .into_iter()
        .find(|t| t.spec().name == "models.classify")
        .unwrap()
}
