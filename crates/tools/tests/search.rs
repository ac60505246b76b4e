//! ls, find and grep on real trees, with .gitignore respected.

mod common;

use codemode_spec::ToolErrorKind;
use common::Bench;
use serde_json::json;

/// A small project: sources, an ignored build dir and log, a hidden dir, a .git dir.
fn project() -> Bench {
    let b = Bench::new();
    b.put(".gitignore", "target/\n*.log\n");
    b.put("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n");
    b.put(
        "src/lib.rs",
        "pub fn hello() -> &'static str {\n    \"hello\"\n}\n",
    );
    b.put("src/nested/deep.rs", "// hello from deep\n");
    b.put("README.md", "Say hello.\n");
    b.put("target/debug/out.rs", "fn hello_generated() {}\n");
    b.put("run.log", "hello in a log\n");
    b.put(".github/ci.yml", "name: hello\n");
    b.put(".git/config", "hello = git internals\n");
    b.put("data.bin", b"hello\x00\x01\x02binary");
    b
}

#[tokio::test]
async fn ls_sorts_and_marks_directories() {
    let b = project();
    let text = b.text("ls", json!({})).await;
    assert_eq!(
        text,
        ".git/\n.github/\n.gitignore\nREADME.md\ndata.bin\nrun.log\nsrc/\ntarget/\n"
    );
    assert_eq!(
        b.text("ls", json!({"path": "src"})).await,
        "lib.rs\nmain.rs\nnested/\n"
    );
    std::fs::create_dir(b.path("empty")).unwrap();
    assert!(
        b.text("ls", json!({"path": "empty"}))
            .await
            .contains("empty directory")
    );
}

#[tokio::test]
async fn ls_refuses_files_and_missing_paths() {
    let b = project();
    let err = b.error("ls", json!({"path": "README.md"})).await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(err.message.contains("use read"), "{}", err.message);
    let err = b.error("ls", json!({"path": "nowhere"})).await;
    assert!(
        err.message.contains(b.path("nowhere").to_str().unwrap()),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn find_matches_names_sorted_and_respects_gitignore() {
    let b = project();
    let text = b.text("find", json!({"pattern": "*.rs"})).await;
    assert_eq!(text, "src/lib.rs\nsrc/main.rs\nsrc/nested/deep.rs\n");
    // Hidden directories are searched; .git is not.
    assert_eq!(
        b.text("find", json!({"pattern": "*.yml"})).await,
        ".github/ci.yml\n"
    );
    assert!(
        b.text("find", json!({"pattern": "config"}))
            .await
            .starts_with("No files match")
    );
    // Ignored files are not found.
    assert!(
        b.text("find", json!({"pattern": "*.log"}))
            .await
            .starts_with("No files match")
    );
    // Directories are marked.
    assert_eq!(
        b.text("find", json!({"pattern": "nested"})).await,
        "src/nested/\n"
    );
}

#[tokio::test]
async fn find_with_a_slash_matches_the_relative_path() {
    let b = project();
    assert_eq!(
        b.text("find", json!({"pattern": "src/*.rs"})).await,
        "src/lib.rs\nsrc/main.rs\n"
    );
    assert_eq!(
        b.text("find", json!({"pattern": "src/**/*.rs"})).await,
        "src/lib.rs\nsrc/main.rs\nsrc/nested/deep.rs\n"
    );
    // Relative to the searched directory, while shown relative to the working directory.
    assert_eq!(
        b.text("find", json!({"pattern": "nested/*.rs", "path": "src"}))
            .await,
        "src/nested/deep.rs\n"
    );
}

#[tokio::test]
async fn find_limit_adds_a_note() {
    let b = project();
    let text = b.text("find", json!({"pattern": "*.rs", "limit": 2})).await;
    assert!(text.starts_with("src/lib.rs\nsrc/main.rs\n\n"), "{text}");
    assert!(text.contains("Showing 2 of 3 matches"), "{text}");
}

#[tokio::test]
async fn find_refuses_bad_globs_and_missing_roots() {
    let b = project();
    let err = b.error("find", json!({"pattern": "src/[*.rs"})).await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(err.message.contains("invalid glob"), "{}", err.message);
    let err = b
        .error("find", json!({"pattern": "*", "path": "README.md"}))
        .await;
    assert!(err.message.contains("not a directory"), "{}", err.message);
}

#[tokio::test]
async fn grep_reports_path_line_text_sorted_and_skips_ignored_and_binary() {
    let b = project();
    let text = b.text("grep", json!({"pattern": "hello"})).await;
    assert_eq!(
        text,
        ".github/ci.yml:1:name: hello\nREADME.md:1:Say hello.\nsrc/lib.rs:1:pub fn hello() -> &'static str {\nsrc/lib.rs:2:    \"hello\"\nsrc/nested/deep.rs:1:// hello from deep\n"
    );
}

#[tokio::test]
async fn grep_ignore_case_glob_and_single_file() {
    let b = project();
    let text = b
        .text(
            "grep",
            json!({"pattern": "HELLO", "ignore_case": true, "glob": "*.rs"}),
        )
        .await;
    assert_eq!(
        text,
        "src/lib.rs:1:pub fn hello() -> &'static str {\nsrc/lib.rs:2:    \"hello\"\nsrc/main.rs:2:    println!(\"Hello\");\nsrc/nested/deep.rs:1:// hello from deep\n"
    );
    let text = b
        .text("grep", json!({"pattern": "Hello", "path": "src/main.rs"}))
        .await;
    assert_eq!(text, "src/main.rs:2:    println!(\"Hello\");\n");
    let text = b
        .text("grep", json!({"pattern": "hello", "glob": "src/*.rs"}))
        .await;
    assert_eq!(
        text,
        "src/lib.rs:1:pub fn hello() -> &'static str {\nsrc/lib.rs:2:    \"hello\"\n"
    );
    assert!(
        b.text("grep", json!({"pattern": "absent-word"}))
            .await
            .starts_with("No matches")
    );
}

#[tokio::test]
async fn grep_limit_stops_with_a_note() {
    let b = project();
    let text = b
        .text("grep", json!({"pattern": "hello", "limit": 2}))
        .await;
    assert!(
        text.starts_with(".github/ci.yml:1:name: hello\nREADME.md:1:Say hello.\n\n"),
        "{text}"
    );
    assert!(text.contains("Stopped after 2 matching lines"), "{text}");
    // Exactly as many matches as the limit: no note.
    let text = b
        .text(
            "grep",
            json!({"pattern": "hello", "path": "src/lib.rs", "limit": 2}),
        )
        .await;
    assert!(!text.contains("Stopped"), "{text}");
}

#[tokio::test]
async fn grep_refuses_bad_regex_and_missing_paths() {
    let b = project();
    let err = b.error("grep", json!({"pattern": "fn (unclosed"})).await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(
        err.message.contains("invalid regular expression"),
        "{}",
        err.message
    );
    let err = b
        .error("grep", json!({"pattern": "x", "path": "gone"}))
        .await;
    assert!(
        err.message.contains(b.path("gone").to_str().unwrap()),
        "{}",
        err.message
    );
}
