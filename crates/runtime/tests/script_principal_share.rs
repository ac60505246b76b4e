//! With cells off, one token's scripts cannot take the whole sandbox pool either.
//!
//! A script holds a pool worker until it ends, a slow call or an approval asked of its client
//! included. Without a cap per principal, a token firing scripts that each wait on a slow call
//! holds every worker, and another token's scripts wait in the queue until their timeout. The
//! attack here is a burst: twenty scripts of one principal at once against a cap of two.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{Gate, PolicySet, Principal, Registry};
use codemode_runtime::{Codemode, ScriptRequest, ScriptRun};
use codemode_spec::{CallKind, Exposure, ToolSpec};
use common::{PERMIT_ALL, Slow};
use serde_json::json;
use tokio::sync::Semaphore;

const HOLD: &str = "await tools.hold({}); return 'held';";

struct Setup {
    codemode: Codemode,
    started: Arc<Semaphore>,
    release: Arc<Semaphore>,
}

fn setup(limit: u32) -> Setup {
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let mut spec = ToolSpec::new("hold", "Waits until released", json!({"type": "object"}));
    spec.kind = CallKind::Tool;
    spec.exposure = Exposure::Codemode;
    let registry = Registry::new();
    registry
        .register(Arc::new(Slow {
            spec,
            started: started.clone(),
            release: release.clone(),
        }))
        .unwrap();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", PERMIT_ALL).unwrap())
        .build()
        .unwrap();
    let codemode = Codemode::builder()
        .gate(gate)
        .max_running_per_principal(limit)
        .build()
        .unwrap();
    Setup {
        codemode,
        started,
        release,
    }
}

fn as_principal(codemode: &Codemode, session: &str, who: &str) {
    codemode.gate().set_principal(
        session,
        Principal {
            id: who.into(),
            team: None,
        },
    );
}

async fn run(codemode: &Codemode, session: &str, source: &str) -> ScriptRun {
    codemode
        .run_script(ScriptRequest {
            source: source.into(),
            session_id: session.into(),
            client: None,
            parent_call_id: None,
            abort: Default::default(),
            determinism: None,
            record: None,
            replay: None,
            on_call: None,
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_principals_scripts_runs_only_its_share_and_others_still_run() {
    let Setup {
        codemode,
        started,
        release,
    } = setup(2);
    for i in 0..20 {
        as_principal(&codemode, &format!("alice-{i}"), "alice");
    }
    as_principal(&codemode, "bob-1", "bob");

    // Twenty of alice's scripts at once, each in its own session.
    let burst: Vec<_> = (0..20)
        .map(|i| {
            let codemode = codemode.clone();
            tokio::spawn(async move { run(&codemode, &format!("alice-{i}"), HOLD).await })
        })
        .collect();
    // Two reach the slow tool.
    let two = tokio::time::timeout(Duration::from_secs(60), started.acquire_many(2))
        .await
        .expect("two of alice's scripts reach their call")
        .unwrap();
    two.forget();

    // Eighteen are refused without running, each saying why and what to do.
    let (mut refused, mut waiting) = (Vec::new(), Vec::new());
    for handle in burst {
        if handle.is_finished() {
            refused.push(handle.await.unwrap());
        } else {
            waiting.push(handle);
        }
    }
    // Refusals that have not returned yet are not waiting on the tool: give them their time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while waiting.len() > 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (done, still): (Vec<_>, Vec<_>) = waiting
            .into_iter()
            .partition(|h: &tokio::task::JoinHandle<ScriptRun>| h.is_finished());
        for handle in done {
            refused.push(handle.await.unwrap());
        }
        waiting = still;
    }
    assert_eq!(refused.len(), 18, "exactly alice's share of two runs");
    for run in &refused {
        assert!(run.is_error, "a refused script is an error: {}", run.text);
        assert!(
            run.text.contains("`alice` already runs 2 scripts")
                && run.text.contains("cells.max_running_per_principal"),
            "the refusal names the principal, the limit and the setting: {}",
            run.text
        );
    }
    assert_eq!(
        started.available_permits(),
        0,
        "no refused script reached the tool"
    );

    // Bob's script runs while alice holds her two workers, and so does one acting for nobody.
    let bob = run(&codemode, "bob-1", "return 'bob ran';").await;
    assert!(!bob.is_error, "bob's script was refused: {}", bob.text);
    assert!(bob.text.contains("bob ran"), "{}", bob.text);
    let nobody = run(&codemode, "cli", "return 'unnamed ran';").await;
    assert!(!nobody.is_error, "{}", nobody.text);

    // Once alice's scripts end, her share is free again.
    release.add_permits(2);
    for handle in waiting {
        let run = handle.await.unwrap();
        assert!(!run.is_error, "{}", run.text);
    }
    release.add_permits(1);
    let again = run(&codemode, "alice-0", HOLD).await;
    assert!(!again.is_error, "alice's share came back: {}", again.text);
}
