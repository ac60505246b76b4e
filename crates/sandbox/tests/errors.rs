//! Errors that must say what happened and what to do (issue 10, items 14, 16 and 17).
mod common;
use codemode_sandbox::*;
use common::*;
use serde_json::json;

async fn a_huge_return_value_counts_against_the_output_limit() {
    // 20 million characters returned, nothing printed: past the 16 Mi-character limit.
    let e = error("return 'x'.repeat(20 * 1024 * 1024)").await;
    assert_eq!(e.name.as_deref(), Some("RangeError"), "{e:?}");
    assert!(
        e.message.contains("returned value is 20971520 characters")
            && e.message.contains("output limit of 16777216"),
        "{}",
        e.message
    );
    // Output and return value share the limit.
    let e = error("text('y'.repeat(10 * 1024 * 1024)); return { s: 'x'.repeat(8 * 1024 * 1024) }")
        .await;
    assert!(
        e.message.contains("10485760 characters already output"),
        "{}",
        e.message
    );
    // Up to the limit is fine.
    let r = run("return 'x'.repeat(1024)").await;
    assert!(r.ok);
}

/// Red team: a string within the output limit but of control characters became about 100 MB
/// of JSON on its way to the host, and the worker aborted ("the sandbox crashed") instead of
/// returning it or saying what to do.
async fn a_returned_string_that_swells_as_json_gets_a_clear_error() {
    let e = error("return '\\x01'.repeat(16 * 1024 * 1024 - 100)").await;
    assert_eq!(e.name.as_deref(), Some("RangeError"), "{e:?}");
    assert!(
        e.message.contains("once written as JSON") && e.message.contains("text()"),
        "{}",
        e.message
    );
    // Quotes and backslashes double at most: a string of them is returned whole.
    let r = run("return '\"'.repeat(1024 * 1024)").await;
    assert!(r.ok, "{:?}", r.error);
}

async fn values_nested_too_deep_get_a_clear_error() {
    let e = error("let v = 1; for (let i = 0; i < 200; i++) v = [v]; return v").await;
    assert_eq!(e.kind, ErrorKind::Script);
    assert!(
        e.message.contains("nested more than 127 levels"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("bridge broken"), "{}", e.message);
    let v = value("let v = 1; for (let i = 0; i < 200; i++) v = { v }; try { await tools.echo(v) } catch (e) { return [e.name, e.message] }").await;
    assert_eq!(v[0], "TypeError");
    assert!(
        v[1].as_str()
            .unwrap()
            .contains("nested more than 127 levels"),
        "{v}"
    );
    let e =
        error("let v = 1; for (let i = 0; i < 200; i++) v = [v]; store('deep', v); return 1").await;
    assert!(
        e.message.contains("nested more than 127 levels"),
        "{}",
        e.message
    );
    // 100 levels are fine.
    let v = value("let v = 1; for (let i = 0; i < 100; i++) v = [v]; return JSON.stringify(await tools.echo(v)).length").await;
    assert_eq!(v, json!(201));
}

fn tiny() -> Sandbox {
    cached("tiny", || SandboxConfig {
        defaults: Limits {
            heap_bytes: 4 * 1024 * 1024,
            ..Limits::default()
        },
        warm: 1,
        ..Default::default()
    })
}

async fn running_out_of_memory_while_compiling_is_not_a_syntax_error() {
    // A script whose source alone does not fit in a 4 MiB heap once compiled.
    let big: String = (0..120_000).map(|i| format!("a{i}=1;")).collect();
    let r = tiny().run(script(&big)).await;
    let e = r.error.unwrap();
    assert_ne!(e.name.as_deref(), Some("SyntaxError"), "{e:?}");
    assert!(e.message.contains("out of memory"), "{}", e.message);
    assert!(tiny().run(script("return 1")).await.ok);
}

async fn load_of_a_missing_key_is_undefined() {
    let mut s =
        script("return [load('missing') === undefined, typeof load('missing'), load('there')]");
    s.store.insert("there".into(), json!(null));
    let r = sandbox().run(s).await;
    assert_eq!(r.value, Some(json!([true, "undefined", null])));
}

both_modes!(
    a_huge_return_value_counts_against_the_output_limit,
    a_returned_string_that_swells_as_json_gets_a_clear_error,
    values_nested_too_deep_get_a_clear_error,
    running_out_of_memory_while_compiling_is_not_a_syntax_error,
    load_of_a_missing_key_is_undefined
);

#[test]
fn full_outputs_are_private_and_expire() {
    use std::os::unix::fs::PermissionsExt;
    let result = |text: &str| {
        result_with_output(vec![OutputItem::Text {
            text: text.into(),
            console: false,
        }])
    };
    let t = render_model_text(&result(&"z".repeat(10_000)), 10);
    let path = t.full_output_path.unwrap();
    let dir = path.parent().unwrap().to_path_buf();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // An old spill is removed when the next one is written.
    let old = dir.join("output-0000000000000000.txt");
    std::fs::write(&old, "old").unwrap();
    let f = std::fs::File::options().write(true).open(&old).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600))
        .unwrap();
    drop(f);
    let t2 = render_model_text(&result(&"w".repeat(10_000)), 10);
    assert!(!old.exists(), "an expired full output was kept");
    assert!(path.exists() && t2.full_output_path.as_ref().unwrap().exists());
    // No more than a bounded number are kept.
    for _ in 0..40 {
        render_model_text(&result(&"v".repeat(10_000)), 10);
    }
    let n = std::fs::read_dir(&dir).unwrap().count();
    assert!(n <= 32, "{n} full outputs kept");
}
