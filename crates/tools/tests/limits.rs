//! Host-side work per call is bounded, whatever the arguments: reads stream, patterns are capped,
//! and errors never echo a huge input back.

mod common;

use std::time::{Duration, Instant};

use codemode_spec::{ToolError, ToolErrorKind, ToolOutput};
use common::{Bench, costly_rules, huge_ignore_file};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The process's peak resident memory so far, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_reads_of_an_endless_proc_file_stay_small() {
    let b = Bench::new();
    let before = peak_rss_kib();
    let reads = (0..8).map(|_| b.call("read", json!({"path": "/proc/self/pagemap"})));
    for result in futures::future::join_all(reads).await {
        let err = result.unwrap_err();
        assert!(err.message.contains("binary"), "{}", err.message);
    }
    let grown_mib = (peak_rss_kib() - before) / 1024;
    // Each read looks at its first 8 KiB; before, each loaded up to 256 MiB.
    assert!(
        grown_mib < 64,
        "eight reads grew the peak by {grown_mib} MiB"
    );
}

#[tokio::test]
async fn a_huge_line_is_streamed_and_cut() {
    let b = Bench::new();
    let mut text = "x".repeat(20 * 1024 * 1024);
    text.push_str("\nsecond line\n");
    b.put("wide.txt", &text);
    let out = b.text("read", json!({"path": "wide.txt"})).await;
    assert!(out.len() < 10_000, "{} bytes returned", out.len());
    assert!(out.contains("[line cut: "), "{}", &out[..200]);
    assert!(out.contains("     2\tsecond line"), "{out:.300}");
    // The script's value is cut the same way.
    let value = b.value("read", json!({"path": "wide.txt"})).await;
    let text = value["text"].as_str().unwrap();
    assert!(
        text.len() < 10_000 && text.ends_with("\nsecond line\n"),
        "{text:.300}"
    );
}

#[tokio::test]
async fn the_output_cap_bounds_structured_values_too_and_says_so() {
    let b = Bench::with(|c| c.max_output_bytes = 4096);
    let lines: String = (0..2000).map(|i| format!("match {i}\n")).collect();
    b.put("many.txt", &lines);
    for i in 0..300 {
        b.put(&format!("d/file_{i:03}_with_a_long_name.txt"), "");
    }
    let grep = b
        .value("grep", json!({"pattern": "match", "limit": 100000}))
        .await;
    assert_eq!(grep["truncated"], true);
    assert!(
        grep.to_string().len() < 3 * 4096,
        "{} bytes",
        grep.to_string().len()
    );
    let read = b.value("read", json!({"path": "many.txt"})).await;
    assert_eq!(read["truncated"], true);
    assert!(read["text"].as_str().unwrap().len() <= 4096);
    let find = b
        .value("find", json!({"pattern": "*.txt", "path": "d"}))
        .await;
    assert_eq!(find["truncated"], true);
    let ls = b.value("ls", json!({"path": "d"})).await;
    assert_eq!(ls["truncated"], true);
    assert!(ls["entries"].as_array().unwrap().len() < 300);
}

#[tokio::test]
async fn a_sixty_megabyte_pattern_is_refused_without_being_echoed() {
    let b = Bench::new();
    b.put("a.txt", "hello\n");
    let huge = "a".repeat(60 * 1024 * 1024);
    let err = b.error("grep", json!({"pattern": huge})).await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(
        err.message.len() < 1000,
        "{} bytes of error",
        err.message.len()
    );
    assert!(err.message.contains("bytes long"), "{}", err.message);
}

#[tokio::test]
async fn a_pattern_that_compiles_too_big_is_refused_briefly() {
    let b = Bench::new();
    b.put("a.txt", "hello\n");
    let err = b.error("grep", json!({"pattern": "\\w{2000}{2000}"})).await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(err.message.len() < 1500, "{}", err.message);
    let err = b
        .error("find", json!({"pattern": "*".repeat(100_000)}))
        .await;
    assert!(err.message.len() < 1000, "{}", err.message);
}

/// Red-team finding: `edit` of a 4 MiB file of "a" with `replace_all` and a 1,000-byte
/// replacement ran for minutes (line numbers were counted from the start for each of 4 million
/// matches, and the result would be 4 GB), and its host could not exit. The result's size is
/// checked first, and line numbers take one pass.
#[tokio::test]
async fn a_replace_all_with_millions_of_matches_is_refused_or_done_at_once() {
    let b = Bench::new();
    b.call(
        "write",
        json!({"path": "big.txt", "content": "a".repeat(4 * 1024 * 1024)}),
    )
    .await
    .unwrap();
    let err = b
        .call("edit", json!({"path": "big.txt", "old_string": "a", "new_string": "b".repeat(1000), "replace_all": true}))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("more than edit writes"),
        "{}",
        err.message
    );
    assert!(err.message.len() < 1000, "{}", err.message);
    // Within the size limit, two million matches on two million lines are replaced at once.
    b.call(
        "write",
        json!({"path": "lines.txt", "content": "a\n".repeat(2 * 1024 * 1024)}),
    )
    .await
    .unwrap();
    let text = b
        .text(
            "edit",
            json!({"path": "lines.txt", "old_string": "a", "new_string": "b", "replace_all": true}),
        )
        .await;
    assert!(text.contains("and 2097132 more"), "{text}");
    assert!(text.len() < 1000, "{text}");
}

/// A PNG of `bytes` bytes: the signature, then filler (read sends images as they are).
fn png(bytes: usize) -> Vec<u8> {
    let mut data = b"\x89PNG\r\n\x1a\n".to_vec();
    data.resize(bytes, 0x5a);
    data
}

/// Red team: each image read is bounded (20 MB), but a script may have thousands in flight, and
/// the results wait for it: 64 parallel reads of a 19 MB image took one `codemode run` to
/// 3.6 GB. Image results now hold a share of one budget until they are dropped, and a read
/// that would pass it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_results_waiting_for_a_script_hold_the_next_read_back() {
    // One 1 MB image costs about 3.7 MB (its bytes, and their base64 twice): three fit.
    let b = Bench::with(|c| c.max_image_memory_bytes = 12 * 1024 * 1024);
    b.put("one.png", png(1024 * 1024));
    let read = || b.call("read", json!({"path": "one.png"}));
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(read().await.unwrap());
    }
    let fourth = read();
    tokio::pin!(fourth);
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut fourth).await;
    assert!(
        early.is_err(),
        "a fourth image was read while three held the budget"
    );
    // A script taking one result frees its share.
    drop(kept.remove(0));
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), fourth)
        .await
        .expect("the read goes on once a result is dropped")
        .unwrap();
    assert_eq!(out.value["type"], "image");
    // An image larger than the whole budget still reads, alone.
    drop(kept);
    let big = Bench::with(|c| c.max_image_memory_bytes = 1024 * 1024);
    big.put("big.png", png(2 * 1024 * 1024));
    let out = big.call("read", json!({"path": "big.png"})).await.unwrap();
    assert_eq!(out.value["type"], "image");
}

/// Twelve nested folders, each with a 1 MiB `.gitignore`, `.ignore` and `.git/info/exclude` of
/// distinct short names, as a cloned repository may hold; returns the deepest folder. Compiled
/// whole, these took one `find` to 4.3 GB and a minute.
fn nested_huge_ignore_files(b: &Bench) -> String {
    let mut deepest = String::new();
    let mut file = 1;
    for level in 0..12 {
        deepest.push_str(&format!("d{level}/"));
        for name in [".gitignore", ".ignore", ".git/info/exclude"] {
            b.put(&format!("{deepest}{name}"), huge_ignore_file(file << 20));
            file += 1;
        }
    }
    b.put(&format!("{deepest}a.txt"), "x");
    deepest
}

#[tokio::test]
async fn huge_ignore_files_fail_a_search_soon_and_say_what_to_do() {
    let b = Bench::new();
    let deepest = nested_huge_ignore_files(&b);
    b.put("elsewhere/a.txt", "x");
    let started = Instant::now();
    for (tool, args) in [
        ("find", json!({"pattern": "*.txt", "path": deepest})),
        ("grep", json!({"pattern": "x", "path": deepest})),
    ] {
        let err = b.error(tool, args).await;
        assert_eq!(err.kind, ToolErrorKind::Failed, "{tool}: {}", err.message);
        assert!(err.message.contains("past 4000 rules"), "{}", err.message);
        assert!(
            err.message.contains("search a folder outside"),
            "{}",
            err.message
        );
        assert!(err.message.contains("/d10/.ignore"), "{}", err.message);
    }
    // Searched from the top, the same files lie inside the search.
    let err = b.error("find", json!({"pattern": "*.txt"})).await;
    assert!(err.message.contains("past 4000 rules"), "{}", err.message);
    assert!(
        err.message.contains("a narrower path that leaves out"),
        "{}",
        err.message
    );
    // Each failed call compiled at most the budget, not 36 MiB of rules.
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the three calls took {took:?}"
    );
    // A folder beside them is searched as ever.
    let found = b
        .value("find", json!({"pattern": "*.txt", "path": "elsewhere"}))
        .await;
    assert_eq!(found["paths"], json!(["elsewhere/a.txt"]));
}

/// A `find` for `*.txt` in `path` on a runtime of its own, cancelled `cancel_after` in when
/// given. Returns its result and how long it took counting until its worker thread ended:
/// dropping the runtime waits for that.
fn find_on_own_runtime(
    b: &Bench,
    path: &str,
    cancel_after: Option<Duration>,
) -> (Result<ToolOutput, ToolError>, Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let result = rt.block_on(async {
        let call = b.call_with(
            "find",
            json!({"pattern": "*.txt", "path": path}),
            cancel.clone(),
        );
        let Some(after) = cancel_after else {
            return call.await;
        };
        let cancel_later = async {
            tokio::time::sleep(after).await;
            cancel.cancel();
        };
        futures::future::join(call, cancel_later).await.0
    });
    drop(rt);
    (result, started.elapsed())
}

/// Cancels a search a quarter into compiling 2,000 costly ignore rules (within the budget) and
/// checks that its worker stops within a fraction of what the whole compile takes: before, it
/// compiled on to the end.
fn cancel_while_rules_compile(search_path: &str) {
    let b = Bench::new();
    b.put("big/.gitignore", costly_rules(2_000));
    b.put("big/inner/a.txt", "x");
    let (whole, full) = find_on_own_runtime(&b, search_path, None);
    assert!(whole.is_ok(), "{:?}", whole.err());
    let at = full / 4;
    let (result, took) = find_on_own_runtime(&b, search_path, Some(at));
    let err = result.expect_err("the call was cancelled");
    assert_eq!(err.kind, ToolErrorKind::Cancelled, "{}", err.message);
    let after_cancel = took.saturating_sub(at);
    assert!(
        after_cancel < full / 2,
        "the worker ran on {after_cancel:?} after the cancel; the whole search takes {full:?}"
    );
}

#[test]
fn a_search_cancelled_while_rules_above_it_compile_stops_soon() {
    cancel_while_rules_compile("big/inner");
}

#[test]
fn a_search_cancelled_while_rules_inside_it_compile_stops_soon() {
    cancel_while_rules_compile(".");
}
