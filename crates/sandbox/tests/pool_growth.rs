//! A burst of scripts gets a worker each, up to `max_concurrent`, even when the first ones hold
//! theirs for long (a call waiting for a person, a long tool). Workers used to be started only
//! when a script was submitted, at most 8 preparing at once: scripts of a burst submitted
//! while 8 were preparing stayed queued until a worker finished a script, though the pool had
//! room, and so did every later script behind them.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use codemode_sandbox::*;
use common::HoldingHost;
use serde_json::json;

const BURST: usize = 20;

async fn a_burst_of_held_scripts_gets_a_worker_each() {
    let sandbox = Sandbox::new(SandboxConfig {
        isolation: common::mode(),
        warm: 1,
        max_concurrent: BURST + 4,
        ..Default::default()
    })
    .unwrap();
    let host = Arc::new(HoldingHost::default());
    let runs: Vec<_> = (0..BURST)
        .map(|_| {
            let script = Script::new("return await tools.hold({})", host.clone())
                .with_tools([("hold", "Waits until released")]);
            tokio::spawn(sandbox.run(script))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.holding.load(Ordering::SeqCst) < BURST && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = host.holding.load(Ordering::SeqCst);
    host.released.store(true, Ordering::SeqCst);
    assert_eq!(
        held,
        BURST,
        "scripts running at once, with room for {} in the pool",
        BURST + 4
    );
    for run in runs {
        let r = run.await.unwrap();
        assert_eq!(r.value, Some(json!("released")), "{:?}", r.error);
    }
}

both_modes!(multi: a_burst_of_held_scripts_gets_a_worker_each);
