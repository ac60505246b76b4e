//! Path resolution and the facts the policy decides on.

mod common;

use std::os::unix::fs::symlink;

use codemode_spec::ToolErrorKind;
use codemode_tools::resolve_path;
use common::Bench;
use serde_json::json;

fn facts(bench: &Bench, tool: &str, args: serde_json::Value) -> Vec<String> {
    bench.tool(tool).facts(&args).unwrap().paths
}

#[test]
fn dot_dot_is_normalised() {
    let b = Bench::new();
    std::fs::create_dir(b.path("sub")).unwrap();
    let expected = b.path("a.txt").to_str().unwrap().to_owned();
    assert_eq!(
        facts(&b, "read", json!({"path": "sub/../a.txt"})),
        vec![expected.clone()]
    );
    assert_eq!(
        facts(
            &b,
            "write",
            json!({"path": "./sub/./../a.txt", "content": ""})
        ),
        vec![expected]
    );
    // `..` above the root stays at the root, as the kernel does.
    assert_eq!(
        resolve_path(&b.root, "/../../etc").unwrap().to_str(),
        Some("/etc")
    );
}

#[test]
fn symlinks_resolve_to_their_targets() {
    let b = Bench::new();
    let outside = tempfile::tempdir().unwrap();
    let outside_root = outside.path().canonicalize().unwrap();
    std::fs::write(outside_root.join("secret"), "s").unwrap();
    symlink(&outside_root, b.path("link")).unwrap();
    symlink(outside_root.join("secret"), b.path("file-link")).unwrap();

    let through_dir = facts(
        &b,
        "edit",
        json!({"path": "link/secret", "old_string": "a", "new_string": "b"}),
    );
    assert_eq!(
        through_dir,
        vec![outside_root.join("secret").to_str().unwrap().to_owned()]
    );
    let file_link = facts(&b, "read", json!({"path": "file-link"}));
    assert_eq!(
        file_link,
        vec![outside_root.join("secret").to_str().unwrap().to_owned()]
    );
    // `..` after a symlink applies to the link's target, as the kernel applies it.
    let parent = facts(&b, "write", json!({"path": "link/../x", "content": ""}));
    let expected_parent = outside_root.parent().unwrap().join("x");
    assert_eq!(parent, vec![expected_parent.to_str().unwrap().to_owned()]);
    // Search roots resolve too.
    assert_eq!(
        facts(&b, "grep", json!({"pattern": "x", "path": "link"})),
        vec![outside_root.to_str().unwrap().to_owned()]
    );
}

#[test]
fn dangling_symlink_resolves_to_where_a_write_would_land() {
    let b = Bench::new();
    let outside = tempfile::tempdir().unwrap();
    let target = outside
        .path()
        .canonicalize()
        .unwrap()
        .join("new-dir/created.txt");
    symlink(&target, b.path("dangling")).unwrap();
    assert_eq!(
        facts(&b, "write", json!({"path": "dangling", "content": ""})),
        vec![target.to_str().unwrap().to_owned()]
    );
}

#[test]
fn absolute_and_missing_paths() {
    let b = Bench::new();
    let other = tempfile::tempdir().unwrap();
    let other_root = other.path().canonicalize().unwrap();
    let abs = other_root.join("f.txt");
    assert_eq!(
        facts(&b, "read", json!({"path": abs.to_str().unwrap()})),
        vec![abs.to_str().unwrap().to_owned()]
    );
    // A path that does not exist yet: the existing prefix is resolved and the rest appended.
    symlink(&other_root, b.path("link")).unwrap();
    let nested = facts(
        &b,
        "write",
        json!({"path": "link/new/deeper/f.txt", "content": ""}),
    );
    assert_eq!(
        nested,
        vec![
            other_root
                .join("new/deeper/f.txt")
                .to_str()
                .unwrap()
                .to_owned()
        ]
    );
    let plain = facts(&b, "write", json!({"path": "a/b/c.txt", "content": ""}));
    assert_eq!(
        plain,
        vec![b.path("a/b/c.txt").to_str().unwrap().to_owned()]
    );
}

#[test]
fn symlink_loops_are_refused() {
    let b = Bench::new();
    symlink(b.path("loop-b"), b.path("loop-a")).unwrap();
    symlink(b.path("loop-a"), b.path("loop-b")).unwrap();
    let err = b
        .tool("read")
        .facts(&json!({"path": "loop-a"}))
        .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(err.message.contains("symlink loop"), "{}", err.message);
}

#[test]
fn search_roots_and_bash_default_to_the_workdir() {
    let b = Bench::new();
    let root = vec![b.root.to_str().unwrap().to_owned()];
    assert_eq!(facts(&b, "ls", json!({})), root);
    assert_eq!(facts(&b, "find", json!({"pattern": "*.rs"})), root);
    assert_eq!(facts(&b, "grep", json!({"pattern": "x"})), root);
    assert_eq!(
        facts(&b, "bash", json!({"command": "cat /etc/passwd"})),
        root
    );
}

#[test]
fn workdir_given_through_a_symlink_is_resolved() {
    let real = tempfile::tempdir().unwrap();
    let real_root = real.path().canonicalize().unwrap();
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("work");
    symlink(&real_root, &link).unwrap();
    assert_eq!(
        resolve_path(&link, "f.txt").unwrap(),
        real_root.join("f.txt")
    );
}

#[test]
fn bad_paths_are_refused_with_reasons() {
    let b = Bench::new();
    let empty = b.tool("read").facts(&json!({"path": ""})).unwrap_err();
    assert!(empty.message.contains("empty"), "{}", empty.message);
    let nul = b
        .tool("read")
        .facts(&json!({"path": "a\u{0}b"}))
        .unwrap_err();
    assert!(nul.message.contains("NUL"), "{}", nul.message);
    let unknown = b
        .tool("read")
        .facts(&json!({"path": "a", "extra": 1}))
        .unwrap_err();
    assert_eq!(unknown.kind, ToolErrorKind::InvalidArguments);
}
