//! A script that starts many calls with big answers cannot make the host hold them all: past
//! the script's bound (its heap limit, 64 MiB at least) an answer is dropped and the script gets
//! an error saying the call ran.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use codemode_sandbox::*;
use common::*;
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::Value;
use tokio::sync::Notify;

/// Answers every call with a JSON string of 4 MiB, all at once when the script's last call
/// was made: so the answers arrive together, not as the script takes them.
struct BigAnswers {
    made: AtomicUsize,
    all_made: Arc<Notify>,
}

const ANSWER: usize = 4 << 20;
const CALLS: usize = 40;

impl Host for BigAnswers {
    fn call(&self, _call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        async { Err(HostError::new("only call_json")) }.boxed_local()
    }
    fn call_json(&self, _call: HostCall) -> LocalBoxFuture<'static, Result<String, HostError>> {
        let last = self.made.fetch_add(1, Ordering::SeqCst) + 1 == CALLS;
        if last {
            self.all_made.notify_waiters();
        }
        let all_made = self.all_made.clone();
        async move {
            if !last {
                // Registered at the sandbox's first poll, which comes before the last call.
                all_made.notified().await;
            }
            Ok(format!("\"{}\"", "x".repeat(ANSWER - 2)))
        }
        .boxed_local()
    }
}

async fn answers_past_the_bound_are_dropped_and_the_script_is_told() {
    let sandbox = cached("held-answers", || SandboxConfig {
        defaults: Limits {
            heap_bytes: 32 << 20,
            ..Limits::default()
        },
        warm: 1,
        ..Default::default()
    });
    let src = r#"const out = await Promise.all(Array.from({ length: 40 }, () =>
                   tools.big({}).then(s => s.length, e => e.message)));
                 const kept = out.filter(x => typeof x === "number");
                 const dropped = out.filter(x => typeof x === "string");
                 return { kept: kept.length, dropped: dropped.length, first: dropped[0] ?? null }"#;
    let r = sandbox
        .run(
            Script::new(
                src,
                Arc::new(BigAnswers {
                    made: AtomicUsize::new(0),
                    all_made: Arc::new(Notify::new()),
                }),
            )
            .with_tools([("big", "")]),
        )
        .await;
    assert!(r.ok, "{:?}", r.error);
    let v = r.value.unwrap();
    let kept = v["kept"].as_u64().unwrap() as usize;
    let dropped = v["dropped"].as_u64().unwrap() as usize;
    assert_eq!(kept + dropped, CALLS, "{v}");
    assert!(kept >= 1, "{v}");
    // At most 64 MiB held at once, and the last call's answer, which came at once and was taken
    // before the others arrived.
    let most = (64 << 20) / ANSWER + 1;
    assert!(kept <= most, "{kept} answers of 4 MiB were held: {v}");
    assert!(dropped >= CALLS - most, "{v}");
    // In a worker process the host holds the answers, and this bound drops them; in a thread
    // the answers go into the VM as they come, and its heap limit refuses the rest.
    let first = v["first"].as_str().unwrap_or_default();
    let told = match mode() {
        Isolation::Process => {
            first.contains("The call ran, but its answer (4.0 MiB) was dropped")
                && first.contains("at most 64.0 MiB may wait")
        }
        Isolation::Thread => first.contains("does not fit in the script's heap limit"),
    };
    assert!(told, "{first}");
    // Answers the host dropped are on record as failed calls (in a thread, answers the heap
    // refused after delivery count as delivered).
    let failed = r
        .calls
        .iter()
        .filter(|c| c.status == CallStatus::Error)
        .count();
    assert!(
        failed >= 1 && failed <= dropped,
        "{failed} failed, {dropped} dropped"
    );
    if mode() == Isolation::Process {
        assert_eq!(failed, dropped);
    }
}

both_modes!(answers_past_the_bound_are_dropped_and_the_script_is_told);
