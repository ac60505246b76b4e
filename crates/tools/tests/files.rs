//! read, write and edit on real files.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use base64::Engine;
use codemode_spec::{ContentBlock, ToolErrorKind};
use common::Bench;
use serde_json::json;

fn dir_names(b: &Bench, rel: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(b.path(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn read_numbers_lines_like_cat_n() {
    let b = Bench::new();
    b.put("a.txt", "alpha\nbeta\r\ngamma\n");
    let text = b.text("read", json!({"path": "a.txt"})).await;
    assert_eq!(text, "     1\talpha\n     2\tbeta\n     3\tgamma\n");
}

#[tokio::test]
async fn read_offset_and_limit_say_how_to_read_on() {
    let b = Bench::new();
    let body: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    b.put("ten.txt", body);
    let text = b
        .text("read", json!({"path": "ten.txt", "offset": 3, "limit": 2}))
        .await;
    assert!(
        text.starts_with("     3\tline 3\n     4\tline 4\n"),
        "{text}"
    );
    assert!(!text.contains("line 5"), "{text}");
    assert!(text.contains("lines 3-4 of 10"), "{text}");
    assert!(text.contains("offset=5"), "{text}");
    // The last page has no note.
    let tail = b
        .text("read", json!({"path": "ten.txt", "offset": 9}))
        .await;
    assert_eq!(tail, "     9\tline 9\n    10\tline 10\n");
    let err = b
        .error("read", json!({"path": "ten.txt", "offset": 11}))
        .await;
    assert!(err.message.contains("10 lines"), "{}", err.message);
}

#[tokio::test]
async fn read_stops_at_the_byte_cap() {
    let b = Bench::with(|c| c.max_output_bytes = 200);
    let body: String = (1..=100).map(|i| format!("row {i:03}\n")).collect();
    b.put("big.txt", body);
    let text = b.text("read", json!({"path": "big.txt"})).await;
    assert!(text.contains("     1\trow 001"), "{text}");
    assert!(!text.contains("row 100"), "{text}");
    assert!(text.contains("output cap of 200 bytes"), "{text}");
    let shown = text.lines().filter(|l| l.contains("\trow ")).count();
    assert!(text.contains(&format!("offset={}", shown + 1)), "{text}");
}

#[tokio::test]
async fn read_returns_images_as_image_blocks() {
    let b = Bench::new();
    let png: Vec<u8> = [
        b"\x89PNG\r\n\x1a\n".as_slice(),
        &[0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 1, 2, 3],
    ]
    .concat();
    b.put("pic.dat", &png);
    let out = b.call("read", json!({"path": "pic.dat"})).await.unwrap();
    assert_eq!(out.value["type"], "image");
    assert_eq!(out.value["mimeType"], "image/png");
    let data = out.value["data"].as_str().unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        png
    );
    assert_eq!(
        out.content,
        Some(vec![ContentBlock::Image {
            data: data.to_owned(),
            mime_type: "image/png".into()
        }])
    );
    let gif = b.put("x.gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00");
    let out = b
        .call("read", json!({"path": gif.to_str().unwrap()}))
        .await
        .unwrap();
    assert_eq!(out.value["mimeType"], "image/gif");
    let webp = b.put("x.webp", b"RIFF\x10\x00\x00\x00WEBPVP8 \x00\x00");
    assert_eq!(
        b.call("read", json!({"path": webp.to_str().unwrap()}))
            .await
            .unwrap()
            .value["mimeType"],
        "image/webp"
    );
    b.put("x.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00");
    assert_eq!(
        b.call("read", json!({"path": "x.jpg"}))
            .await
            .unwrap()
            .value["mimeType"],
        "image/jpeg"
    );
}

#[tokio::test]
async fn read_refuses_binary_missing_and_directories() {
    let b = Bench::new();
    b.put("blob.bin", [0x7f, b'E', b'L', b'F', 0, 0, 1, 2]);
    let err = b.error("read", json!({"path": "blob.bin"})).await;
    assert!(err.message.contains("binary"), "{}", err.message);

    let err = b.error("read", json!({"path": "sub/../missing.txt"})).await;
    let resolved = b.path("missing.txt");
    assert!(
        err.message.contains(resolved.to_str().unwrap()),
        "{}",
        err.message
    );
    assert!(err.message.contains("not found"), "{}", err.message);

    std::fs::create_dir(b.path("d")).unwrap();
    let err = b.error("read", json!({"path": "d"})).await;
    assert!(err.message.contains("directory"), "{}", err.message);
}

#[tokio::test]
async fn write_creates_parents_and_reports_bytes() {
    let b = Bench::new();
    let text = b
        .text(
            "write",
            json!({"path": "deep/er/new.txt", "content": "héllo\n"}),
        )
        .await;
    assert!(text.contains("7 bytes"), "{text}");
    assert!(text.contains("deep/er/new.txt"), "{text}");
    assert_eq!(
        std::fs::read_to_string(b.path("deep/er/new.txt")).unwrap(),
        "héllo\n"
    );
}

#[tokio::test]
async fn write_replaces_by_rename_and_leaves_no_temp_files() {
    let b = Bench::new();
    let path = b.put("f.txt", "old content");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let inode_before = std::fs::metadata(&path).unwrap().ino();
    // A reader that opened the file before the write keeps seeing the whole old content.
    let held_open = std::fs::File::open(&path).unwrap();

    b.text("write", json!({"path": "f.txt", "content": "new content"}))
        .await;

    assert_eq!(std::fs::read_to_string(&path).unwrap(), "new content");
    let meta = std::fs::metadata(&path).unwrap();
    assert_ne!(
        meta.ino(),
        inode_before,
        "the file was rewritten in place, not replaced"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(std::io::read_to_string(held_open).unwrap(), "old content");
    assert_eq!(dir_names(&b, "."), vec!["f.txt"]);
}

#[tokio::test]
async fn write_and_edit_take_names_as_long_as_the_file_system_does() {
    // 255 bytes is the longest name Linux file systems take; the temporary file beside it
    // must not need a longer one.
    let b = Bench::new();
    let name = "n".repeat(250);
    b.text("write", json!({"path": name, "content": "one"}))
        .await;
    b.text(
        "edit",
        json!({"path": name, "old_string": "one", "new_string": "two"}),
    )
    .await;
    assert_eq!(std::fs::read_to_string(b.path(&name)).unwrap(), "two");
    assert_eq!(dir_names(&b, "."), vec![name]);
}

#[tokio::test]
async fn write_through_a_symlink_updates_the_target_and_keeps_the_link() {
    let b = Bench::new();
    let target = b.put("real.txt", "before");
    symlink(&target, b.path("alias.txt")).unwrap();
    b.text("write", json!({"path": "alias.txt", "content": "after"}))
        .await;
    assert!(
        std::fs::symlink_metadata(b.path("alias.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "after");
}

#[tokio::test]
async fn write_onto_a_directory_fails_clearly() {
    let b = Bench::new();
    std::fs::create_dir(b.path("d")).unwrap();
    let err = b.error("write", json!({"path": "d", "content": "x"})).await;
    assert!(err.message.contains("is a directory"), "{}", err.message);
    // A parent that is a file cannot hold a new file.
    b.put("plain", "x");
    let err = b
        .error("write", json!({"path": "plain/child.txt", "content": "x"}))
        .await;
    assert_eq!(err.kind, ToolErrorKind::Failed);
    assert!(err.message.contains("plain"), "{}", err.message);
}

#[tokio::test]
async fn edit_replaces_one_exact_occurrence() {
    let b = Bench::new();
    let path = b.put("code.rs", "fn a() {}\nfn b() {}\n");
    let inode_before = std::fs::metadata(&path).unwrap().ino();
    let text = b
        .text(
            "edit",
            json!({"path": "code.rs", "old_string": "fn b", "new_string": "fn renamed"}),
        )
        .await;
    assert!(text.contains("1 occurrence"), "{text}");
    assert!(text.contains("line 2"), "{text}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "fn a() {}\nfn renamed() {}\n"
    );
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode_before);
    assert_eq!(dir_names(&b, "."), vec!["code.rs"]);
}

#[tokio::test]
async fn edit_with_no_match_says_so_and_hints_at_whitespace() {
    let b = Bench::new();
    let path = b.put("code.py", "def f():\n    return 1\n");
    let err = b
        .error(
            "edit",
            json!({"path": "code.py", "old_string": "def f():\n  return 1", "new_string": "x"}),
        )
        .await;
    assert_eq!(err.kind, ToolErrorKind::Failed);
    assert!(err.message.contains("not found"), "{}", err.message);
    assert!(err.message.contains("indentation"), "{}", err.message);
    assert!(
        err.message.contains("whitespace is ignored"),
        "{}",
        err.message
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "def f():\n    return 1\n"
    );

    b.put("dos.txt", "one\r\ntwo\r\n");
    let err = b
        .error(
            "edit",
            json!({"path": "dos.txt", "old_string": "one\ntwo", "new_string": "x"}),
        )
        .await;
    assert!(err.message.contains("CRLF"), "{}", err.message);
}

#[tokio::test]
async fn edit_with_several_matches_gives_count_and_lines() {
    let b = Bench::new();
    let path = b.put("list.txt", "x = 1\ny = 2\nx = 1\nz\nx = 1\n");
    let err = b
        .error(
            "edit",
            json!({"path": "list.txt", "old_string": "x = 1", "new_string": "x = 9"}),
        )
        .await;
    assert!(err.message.contains("3 times"), "{}", err.message);
    assert!(err.message.contains("lines 1, 3, 5"), "{}", err.message);
    assert!(err.message.contains("replace_all"), "{}", err.message);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "x = 1\ny = 2\nx = 1\nz\nx = 1\n"
    );

    let text = b.text("edit", json!({"path": "list.txt", "old_string": "x = 1", "new_string": "x = 9", "replace_all": true})).await;
    assert!(text.contains("3 occurrences"), "{text}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "x = 9\ny = 2\nx = 9\nz\nx = 9\n"
    );
}

#[tokio::test]
async fn edit_refuses_missing_files_and_no_op_edits() {
    let b = Bench::new();
    let err = b
        .error(
            "edit",
            json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}),
        )
        .await;
    assert!(
        err.message.contains(b.path("nope.txt").to_str().unwrap()),
        "{}",
        err.message
    );
    b.put("same.txt", "a");
    let err = b
        .error(
            "edit",
            json!({"path": "same.txt", "old_string": "a", "new_string": "a"}),
        )
        .await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
}

#[tokio::test]
async fn read_and_edit_refuse_devices() {
    let b = Bench::new();
    let err = b.error("read", json!({"path": "/dev/zero"})).await;
    assert!(
        err.message.contains("not a regular file"),
        "{}",
        err.message
    );
    let err = b
        .error(
            "edit",
            json!({"path": "/dev/null", "old_string": "a", "new_string": "b"}),
        )
        .await;
    assert!(
        err.message.contains("not a regular file"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_cancelled_call_returns_cancelled() {
    let b = Bench::new();
    b.put("a.txt", "x");
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    for (name, args) in [
        ("read", json!({"path": "a.txt"})),
        ("grep", json!({"pattern": "x"})),
        ("find", json!({"pattern": "*"})),
    ] {
        let err = b.call_with(name, args, cancel.clone()).await.unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::Cancelled, "{name}");
    }
}

#[tokio::test]
async fn a_write_cancelled_before_it_starts_changes_nothing() {
    let b = Bench::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let err = b
        .call_with(
            "write",
            json!({"path": "w.txt", "content": "x"}),
            cancel.clone(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Cancelled);
    assert!(!b.path("w.txt").exists());
    b.put("e.txt", "a");
    let err = b
        .call_with(
            "edit",
            json!({"path": "e.txt", "old_string": "a", "new_string": "b"}),
            cancel,
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Cancelled);
    assert_eq!(std::fs::read_to_string(b.path("e.txt")).unwrap(), "a");
}

#[tokio::test]
async fn read_of_an_empty_file_is_empty_text_with_a_visible_note() {
    let b = Bench::new();
    b.put("empty.txt", "");
    let out = b.call("read", json!({"path": "empty.txt"})).await.unwrap();
    assert_eq!(
        out.value,
        json!({"text": "", "startLine": 1, "endLine": 0, "totalLines": 0, "truncated": false})
    );
    match out.content.as_deref() {
        Some([ContentBlock::Text { text }]) => assert!(text.contains("is empty"), "{text}"),
        other => panic!("unexpected content {other:?}"),
    }
}
