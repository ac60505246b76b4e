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

/// `count` filler rules that match nothing here, one a line.
fn filler(count: usize) -> String {
    (0..count).map(|n| format!("filler-{n}\n")).collect()
}

#[tokio::test]
async fn a_long_ignore_file_keeps_the_last_matching_rule_in_force() {
    // Long enough to be compiled in several pieces; git obeys a file's last matching rule.
    let b = Bench::new();
    let rules = format!(
        "*.log\n{}!keep.log\n{}!also.log\n{}also.log\n",
        filler(600),
        filler(600),
        filler(600)
    );
    b.put(".gitignore", rules);
    for name in ["drop.log", "keep.log", "also.log"] {
        b.put(name, "x");
    }
    assert_eq!(
        b.text("find", json!({"pattern": "*.log"})).await,
        "keep.log\n"
    );
}

#[tokio::test]
async fn many_ignore_files_side_by_side_count_one_folder_at_a_time() {
    // 20 folders of 1,000 rules each, 20,000 in all: a search holds one folder's at a time.
    let b = Bench::new();
    for n in 0..20 {
        b.put(
            &format!("pkg{n:02}/.gitignore"),
            format!("{}*.tmp\n", filler(999)),
        );
        b.put(&format!("pkg{n:02}/a.tmp"), "x");
        b.put(&format!("pkg{n:02}/a.txt"), "x");
    }
    let found = b.value("find", json!({"pattern": "a.*"})).await;
    let paths = found["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 20, "{paths:?}");
    assert!(paths.iter().all(|p| p.as_str().unwrap().ends_with(".txt")));

    // Nested, the same files are all in force at once, and too many.
    let b = Bench::new();
    let mut dir = String::new();
    for n in 0..5 {
        dir.push_str(&format!("d{n}/"));
        b.put(&format!("{dir}.gitignore"), filler(1_000));
    }
    b.put(&format!("{dir}a.txt"), "x");
    b.put("d0/d1/d2/d3/side/b.txt", "x");
    let err = b.error("grep", json!({"pattern": "x"})).await;
    assert_eq!(err.kind, ToolErrorKind::Failed);
    assert!(
        err.message.contains("d4/.gitignore takes"),
        "{}",
        err.message
    );
    assert!(err.message.contains("past 4000 rules"), "{}", err.message);
    assert!(err.message.contains("leaves out"), "{}", err.message);
    // A folder beside d4 is under the first four only, whose rules fit.
    let found = b
        .value(
            "find",
            json!({"pattern": "*.txt", "path": "d0/d1/d2/d3/side"}),
        )
        .await;
    assert_eq!(found["paths"], json!(["d0/d1/d2/d3/side/b.txt"]));
}

#[tokio::test]
async fn ignore_rules_past_the_byte_budget_fail_the_search() {
    let b = Bench::new();
    // 200 rules of 1 KB: few rules, but long ones.
    let long: String = (0..200)
        .map(|n| format!("{n}{}\n", "x".repeat(1_000)))
        .collect();
    b.put("vendor/.gitignore", long);
    b.put("vendor/a.txt", "x");
    let err = b
        .error("find", json!({"pattern": "*.txt", "path": "vendor"}))
        .await;
    assert!(
        err.message.contains("past 131072 bytes of rules"),
        "{}",
        err.message
    );
}

/// An ignore file over 1 MiB was skipped silently, so a search returned what it excludes; it
/// now fails the search as rules past the budget do.
#[tokio::test]
async fn an_ignore_file_too_big_to_read_fails_the_search() {
    let b = Bench::new();
    let mut big = String::from("*.txt\n");
    big.push_str(&"# padding\n".repeat(110_000));
    b.put("vendor/.gitignore", big);
    b.put("vendor/a.txt", "x");
    let err = b
        .error("grep", json!({"pattern": "x", "path": "vendor"}))
        .await;
    assert!(
        err.message.contains("vendor/.gitignore")
            && err.message.contains("bytes for one ignore file"),
        "{}",
        err.message
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
