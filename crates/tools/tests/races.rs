//! An attacker swaps symlinks and directories while calls are judged and run. What the policy
//! judged (the prepared call's facts) must be exactly what the call touches: a call judged to
//! stay inside the workspace never reads or writes outside it, however the race falls.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use codemode_spec::{Provenance, RunContext, Tool};
use common::Bench;
use rustix::fs::{CWD, RenameFlags};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 2000;

/// Flips what `link` is, as fast as it can, until stopped: by `rename(2)` of a fresh symlink
/// over it (`targets` are symlink targets), or by exchanging it with `swap` (a real directory
/// and a symlink trading places).
struct Swapper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Swapper {
    fn symlinks(link: PathBuf, targets: [PathBuf; 2]) -> Self {
        Self::start(move |i| {
            let tmp = link.with_extension(format!("tmp{}", i % 2));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&targets[(i % 2) as usize], &tmp).unwrap();
            std::fs::rename(&tmp, &link).unwrap();
        })
    }

    fn exchange(a: PathBuf, b: PathBuf) -> Self {
        Self::start(move |_| {
            rustix::fs::renameat_with(CWD, &a, CWD, &b, RenameFlags::EXCHANGE).unwrap();
        })
    }

    fn start(step: impl Fn(u64) + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut i = 0u64;
            while !flag.load(Ordering::Relaxed) {
                step(i);
                i += 1;
            }
            i
        });
        Swapper {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

fn run_ctx() -> RunContext {
    RunContext {
        provenance: Provenance::model("race", "s"),
        cancel: CancellationToken::new(),
    }
}

/// The judged path, as the policy would see it.
fn judged(
    tool: &dyn Tool,
    args: &serde_json::Value,
) -> Option<(Box<dyn codemode_spec::PreparedCall>, String)> {
    let prepared = tool.prepare(args.clone()).ok()?;
    let path = prepared.facts().paths.first()?.clone();
    Some((prepared, path))
}

fn inside(root: &Path, path: &str) -> bool {
    Path::new(path).starts_with(root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_judged_inside_never_read_outside_while_a_symlink_flips() {
    let b = Bench::new();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().canonicalize().unwrap().join("secret.txt");
    std::fs::write(&secret, "SECRET\n").unwrap();
    let inner = b.put("inside.txt", "INSIDE\n");
    let link = b.path("link");
    std::os::unix::fs::symlink(&inner, &link).unwrap();
    let read = b.tool("read");
    let swapper = Swapper::symlinks(link, [inner.clone(), secret.clone()]);
    let (mut judged_inside, mut escapes, mut refused) = (0, 0, 0);
    for round in 0..ROUNDS * 10 {
        if round >= ROUNDS && judged_inside > 50 {
            break;
        }
        let Some((prepared, path)) = judged(read.as_ref(), &json!({"path": "link"})) else {
            continue;
        };
        if !inside(&b.root, &path) {
            continue; // a workspace-only policy denies it: nothing runs
        }
        judged_inside += 1;
        assert_eq!(path, inner.to_str().unwrap());
        match prepared.run(run_ctx()).await {
            Ok(out) => {
                // What the script gets and what a direct call shows.
                let text = format!("{}\n{}", out.value, common::shown_text(&out));
                if text.contains("SECRET") {
                    escapes += 1;
                }
                assert!(text.contains("INSIDE"), "{text}");
            }
            Err(e) => {
                assert!(e.message.contains("changed"), "{}", e.message);
                refused += 1;
            }
        }
    }
    let flips = swapper.finish();
    assert_eq!(escapes, 0);
    assert!(flips > 100, "the attacker barely ran ({flips} flips)");
    assert!(
        judged_inside > 50,
        "too few reads judged inside: {judged_inside}"
    );
    eprintln!("{judged_inside} judged inside, {refused} refused, {flips} flips");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_judged_inside_never_land_outside_while_a_symlink_flips() {
    let b = Bench::new();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().canonicalize().unwrap().join("victim.txt");
    std::fs::write(&victim, "UNTOUCHED").unwrap();
    let target = b.put("target.txt", "start");
    let link = b.path("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let write = b.tool("write");
    let swapper = Swapper::symlinks(link, [target.clone(), victim.clone()]);
    let mut written = 0;
    // Keep going until enough writes ran: on a loaded 2-core machine the
    // swapper can win most rounds, and a round it wins proves nothing.
    for i in 0..ROUNDS * 10 {
        if i >= ROUNDS && written >= 50 {
            break;
        }
        let content = format!("write {i}");
        let args = json!({"path": "link", "content": content});
        let Some((prepared, path)) = judged(write.as_ref(), &args) else {
            continue;
        };
        if !inside(&b.root, &path) {
            continue;
        }
        if prepared.run(run_ctx()).await.is_ok() {
            written += 1;
            // It landed where it was judged to land.
            assert_eq!(std::fs::read_to_string(&target).unwrap(), content);
        }
    }
    swapper.finish();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "UNTOUCHED");
    assert!(written >= 50, "too few writes ran: {written}");
    // No temporary file was left outside either.
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_symlink_leads_no_tool_outside() {
    let b = Bench::new();
    let outside = tempfile::tempdir().unwrap();
    let out_dir = outside.path().canonicalize().unwrap();
    std::fs::write(out_dir.join("file.txt"), "SECRET\n").unwrap();
    std::fs::create_dir_all(out_dir.join("deeper")).unwrap();
    std::fs::write(out_dir.join("deeper/more.txt"), "SECRET\n").unwrap();
    b.put("dir/file.txt", "INSIDE\n");
    b.put("dir/deeper/more.txt", "INSIDE\n");
    // `swap` is a symlink to the outside; the attacker exchanges it with the real `dir`.
    std::os::unix::fs::symlink(&out_dir, b.path("swap")).unwrap();
    let swapper = Swapper::exchange(b.path("dir"), b.path("swap"));
    let (read, grep, find, ls, write) = (
        b.tool("read"),
        b.tool("grep"),
        b.tool("find"),
        b.tool("ls"),
        b.tool("write"),
    );
    let mut ran = 0;
    for i in 0..ROUNDS / 2 {
        let calls = [
            (&read, json!({"path": "dir/file.txt"})),
            (&read, json!({"path": "dir/deeper/more.txt"})),
            (&grep, json!({"pattern": "SECRET|INSIDE", "path": "dir"})),
            (&grep, json!({"pattern": "SECRET|INSIDE"})),
            (&find, json!({"pattern": "*.txt"})),
            (&ls, json!({"path": "dir/deeper"})),
            (
                &write,
                json!({"path": "dir/deeper/new.txt", "content": format!("{i}")}),
            ),
        ];
        for (tool, args) in calls {
            let Some((prepared, path)) = judged(tool.as_ref(), &args) else {
                continue;
            };
            if !inside(&b.root, &path) {
                continue;
            }
            if let Ok(out) = prepared.run(run_ctx()).await {
                ran += 1;
                // What the script gets and what a direct call shows; file content is shown at
                // the end of a line there (`path:1:SECRET`, `1\tSECRET`).
                let shown = common::shown_text(&out);
                let leaked = out.value.to_string().contains("SECRET")
                    || shown.lines().any(|l| l.ends_with("SECRET"));
                assert!(!leaked, "{args} escaped: {} / {shown}", out.value);
            }
        }
    }
    swapper.finish();
    assert!(
        !out_dir.join("deeper/new.txt").exists(),
        "a write judged inside landed outside"
    );
    assert!(ran > 100, "too few calls ran: {ran}");
}
