//! How much a call allocates at its peak, counted by this binary's own allocator: failed edits
//! of big files and searches under big ignore files stay within bounds. The tests run one at a
//! time, since the count is the whole process's.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use codemode_spec::ToolErrorKind;
use common::{Bench, costly_rules, huge_ignore_file};
use serde_json::json;

/// The system allocator, counting the bytes live now and the most live since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only counts are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for this call.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised for this call.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test throughout: the counts are shared by every thread.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs a tool call and returns its result with the most bytes it had allocated at once beyond
/// what was live when it started.
fn peak_of_call(
    b: &Bench,
    tool: &str,
    args: serde_json::Value,
) -> (
    Result<codemode_spec::ToolOutput, codemode_spec::ToolError>,
    usize,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let result = rt.block_on(b.call(tool, args));
    drop(rt);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    (result, peak)
}

const MIB: usize = 1024 * 1024;

fn assert_below_twice(peak: usize, size: usize) {
    assert!(
        peak < 2 * size,
        "a failed edit of {} MiB allocated {} MiB at its peak",
        size / MIB,
        peak / MIB
    );
}

#[test]
fn a_failed_edit_of_a_big_file_allocates_less_than_twice_its_size() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let b = Bench::new();
    // 16 million one-letter words, with the only text that differs from "a" at the very end, so
    // the whitespace-insensitive comparison goes through the whole file. Before, squashing this
    // file's words took 25 times its size (800 MiB).
    let mut text = "a ".repeat(16 * MIB);
    text.push_str("end\n");
    let size = text.len();
    let path = b.put("words.txt", &text);
    drop(text);

    // Differs only in whitespace: the hint says so.
    let (result, peak) = peak_of_call(
        &b,
        "edit",
        json!({"path": "words.txt", "old_string": "a\n\tend", "new_string": "x"}),
    );
    let err = result.expect_err("old_string does not occur as it is");
    assert_eq!(err.kind, ToolErrorKind::Failed);
    assert!(err.message.contains("not found"), "{}", err.message);
    assert!(
        err.message.contains("whitespace is ignored"),
        "{}",
        err.message
    );
    assert_below_twice(peak, size);

    // Not there at all: no hint, and no more memory.
    let (result, peak) = peak_of_call(
        &b,
        "edit",
        json!({"path": "words.txt", "old_string": "a\n\tb", "new_string": "x"}),
    );
    let err = result.expect_err("old_string does not occur");
    assert!(
        !err.message.contains("whitespace is ignored"),
        "{}",
        err.message
    );
    assert_below_twice(peak, size);
    assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, size);
}

#[test]
fn a_search_under_huge_ignore_files_allocates_tens_of_mb_at_most() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let b = Bench::new();
    // Four nested folders, each with three 1 MiB ignore files of short distinct names: compiled
    // whole, ~1.4 GB.
    let mut deepest = String::new();
    let mut file = 1;
    for level in 0..4 {
        deepest.push_str(&format!("d{level}/"));
        for name in [".gitignore", ".ignore", ".git/info/exclude"] {
            b.put(&format!("{deepest}{name}"), huge_ignore_file(file << 20));
            file += 1;
        }
    }
    b.put(&format!("{deepest}a.txt"), "x");
    let (result, peak) = peak_of_call(&b, "find", json!({"pattern": "*.txt", "path": deepest}));
    let err = result.expect_err("the rules are more than a search compiles");
    assert!(err.message.contains("past 4000 rules"), "{}", err.message);
    assert!(
        peak < 64 * MIB,
        "the search allocated {} MiB at its peak",
        peak / MIB
    );
}

#[test]
fn the_costliest_rules_a_search_may_hold_take_tens_of_mb_at_most() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let b = Bench::new();
    // Just within the budget, rules that each compile to a regex of their own.
    b.put("big/.gitignore", costly_rules(3_990));
    b.put("big/inner/a.txt", "x");
    let (result, peak) = peak_of_call(&b, "find", json!({"pattern": "*.txt", "path": "big/inner"}));
    let found = result.expect("the rules are within the budget");
    assert_eq!(found.value["paths"], json!(["big/inner/a.txt"]));
    assert!(
        peak < 64 * MIB,
        "the search allocated {} MiB at its peak",
        peak / MIB
    );
}
