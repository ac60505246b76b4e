//! A secret file (the audit key) cannot be read by any built-in tool: not by its path, a
//! symlink, a hard link, nor by searching the directory that holds it.

mod common;

use std::os::unix::fs::symlink;

use common::Bench;
use serde_json::json;

const KEY: &str = "KEYMATERIAL-7f3a9c\n";

/// A bench whose tools keep `state/audit.key` (outside the working directory) secret, with a
/// symlink and a hard link to it inside the working directory.
fn bench_with_secret() -> (Bench, tempfile::TempDir, std::path::PathBuf) {
    let state = tempfile::tempdir().unwrap();
    let key = state.path().canonicalize().unwrap().join("audit.key");
    std::fs::write(&key, KEY).unwrap();
    std::fs::write(key.with_file_name("notes.txt"), "KEYMATERIAL is not here\n").unwrap();
    let secret = key.clone();
    let bench = Bench::with(move |c| c.secret_files = vec![secret]);
    symlink(&key, bench.path("via-symlink")).unwrap();
    std::fs::hard_link(&key, bench.path("via-hardlink")).unwrap();
    (bench, state, key)
}

#[tokio::test]
async fn read_refuses_the_secret_by_any_name() {
    let (b, _state, key) = bench_with_secret();
    for path in [
        key.display().to_string(),
        "via-symlink".into(),
        "via-hardlink".into(),
    ] {
        let err = b.error("read", json!({"path": path})).await;
        assert!(err.message.contains("audit key"), "{path}: {}", err.message);
        assert!(!err.message.contains("KEYMATERIAL"), "{}", err.message);
    }
}

#[tokio::test]
async fn edit_refuses_the_secret_and_does_not_show_it() {
    let (b, _state, key) = bench_with_secret();
    let err = b
        .error(
            "edit",
            json!({"path": "via-hardlink", "old_string": "nothing like this", "new_string": "x"}),
        )
        .await;
    assert!(err.message.contains("audit key"), "{}", err.message);
    assert!(!err.message.contains("KEYMATERIAL"), "{}", err.message);
    assert_eq!(std::fs::read_to_string(&key).unwrap(), KEY);
}

#[tokio::test]
async fn grep_skips_the_secret_while_searching_and_refuses_it_named() {
    let (b, _state, key) = bench_with_secret();
    // Searching the key's directory finds the other file only.
    let dir = key.parent().unwrap().display().to_string();
    let found = b
        .value("grep", json!({"pattern": "KEYMATERIAL", "path": dir}))
        .await;
    let matches = found["matches"].as_array().unwrap();
    assert_eq!(matches.len(), 1, "{found}");
    assert!(
        matches[0]["path"].as_str().unwrap().ends_with("notes.txt"),
        "{found}"
    );
    // The working directory holds a hard link to it: skipped as well. (The symlink is not
    // followed by a directory search anyway.)
    let found = b.value("grep", json!({"pattern": "KEYMATERIAL"})).await;
    assert_eq!(found["matches"], json!([]), "{found}");
    // A byte-by-byte probe of the file named directly is refused, not answered.
    for path in [key.display().to_string(), "via-hardlink".into()] {
        let err = b
            .error("grep", json!({"pattern": "^K", "path": path}))
            .await;
        assert!(err.message.contains("audit key"), "{path}: {}", err.message);
    }
}

#[tokio::test]
async fn other_files_read_as_before() {
    let (b, _state, key) = bench_with_secret();
    let notes = key.with_file_name("notes.txt").display().to_string();
    let text = b.text("read", json!({"path": notes})).await;
    assert!(text.contains("KEYMATERIAL is not here"), "{text}");
}
