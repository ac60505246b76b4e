//! A script's timeout covers its wait for a worker. One queued behind workers held by long
//! calls or paused approvals used to wait until one was freed (an hour, for an approval), then
//! ran with its whole timeout. Now it is answered when its timeout passes, and says it never
//! started, rather than "timed out" as if its own code had been too slow.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use codemode_sandbox::*;
use common::HoldingHost;
use serde_json::json;

async fn a_script_whose_timeout_passed_in_the_queue_says_it_never_started() {
    let sandbox = Sandbox::new(SandboxConfig {
        isolation: common::mode(),
        warm: 1,
        max_concurrent: 1,
        ..Default::default()
    })
    .unwrap();
    let host = Arc::new(HoldingHost::default());
    let holder = Script::new("return await tools.hold({})", host.clone())
        .with_tools([("hold", "Waits until released")]);
    let holder = tokio::spawn(sandbox.run(holder));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = Script::new(
        "// @options: {\"timeout_ms\": 300}\nreturn 1 + 1",
        Arc::new(HoldingHost::default()),
    );
    let queued = tokio::spawn(sandbox.run(queued));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Answered within its timeout (plus slack), not when the worker it waited for was freed.
    assert!(
        queued.is_finished(),
        "a script queued behind a held worker is still waiting 1.5 s into its 300 ms timeout"
    );
    host.released.store(true, Ordering::SeqCst);
    let held = holder.await.unwrap();
    assert_eq!(held.value, Some(json!("released")), "{:?}", held.error);
    let r = queued.await.unwrap();
    let e = r.error.expect("the queued script failed");
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(
        e.message.contains("did not start") && e.message.contains("waited"),
        "the script is told it waited for a worker and never ran: {}",
        e.message
    );
}

both_modes!(multi: a_script_whose_timeout_passed_in_the_queue_says_it_never_started);
