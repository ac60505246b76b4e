//! At most four model calls of one script are in flight; the others wait their turn.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use serde_json::json;

#[tokio::test]
async fn at_most_four_calls_per_script_are_in_flight() {
    let f = fixture().await;
    f.provider
        .configure(|k| k.delay = Duration::from_millis(200));
    let calls = (0..10).map(|i| {
        let args = if i % 2 == 0 {
            json!({"model": judge(), "context": one_choice_question()})
        } else {
            json!({"model": painter(), "context": {"input": [{"type": "text", "text": "fox"}]}})
        };
        let tool = if i % 2 == 0 {
            f.classify.clone()
        } else {
            f.images.clone()
        };
        async move { tool.call(script_call(args, "one-script")).await.unwrap() }
    });
    let outs = join_all(calls).await;
    assert!(outs.iter().all(|o| o.value["stopReason"] == "stop"));
    assert_eq!(f.provider.requests().len(), 10);
    assert_eq!(
        f.provider.max_in_flight(),
        4,
        "classify and generateImages share the four slots"
    );
}

#[tokio::test]
async fn each_script_has_its_own_four_slots() {
    let f = fixture().await;
    f.provider
        .configure(|k| k.delay = Duration::from_millis(500));
    let calls = (0..8).map(|i| {
        let tool = f.classify.clone();
        let script = if i < 4 { "script-a" } else { "script-b" };
        async move {
            tool.call(script_call(
                json!({"model": judge(), "context": one_choice_question()}),
                script,
            ))
            .await
            .unwrap()
        }
    });
    join_all(calls).await;
    // Both scripts' four calls overlap: the limit is per script, not global.
    assert_eq!(f.provider.max_in_flight(), 8);
}

#[tokio::test]
async fn a_cancelled_waiter_gives_up_its_place() {
    let f = fixture().await;
    f.provider
        .configure(|k| k.delay = Duration::from_millis(600));
    let args = || json!({"model": judge(), "context": one_choice_question()});
    let running: Vec<_> = (0..4)
        .map(|_| tokio::spawn(f.classify.call(script_call(args(), "s"))))
        .collect();
    // Let the four take every slot, then queue a fifth and cancel it while it waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = script_call(args(), "s");
    let cancel = waiting.cancel.clone();
    let waiter = tokio::spawn(f.classify.call(waiting));
    tokio::time::sleep(Duration::from_millis(50)).await;
    cancel.cancel();
    let cancelled = waiter.await.unwrap().unwrap_err();
    assert_eq!(cancelled.kind, codemode_spec::ToolErrorKind::Cancelled);
    assert_eq!(
        cancelled.effect,
        codemode_spec::Effect::None,
        "it never sent, so nothing can be billed"
    );
    for task in running {
        assert_eq!(task.await.unwrap().unwrap().value["stopReason"], "stop");
    }
    assert_eq!(
        f.provider.requests().len(),
        4,
        "the cancelled waiter never sent"
    );
    // Its place was given up: the next call still gets a slot.
    let out = f.classify.call(script_call(args(), "s")).await.unwrap();
    assert_eq!(out.value["stopReason"], "stop");
    assert_eq!(f.provider.requests().len(), 5);
}
