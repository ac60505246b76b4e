//! A script still running when its session ended must not bring the session's `store()` values
//! back: they would be kept for a session nobody can reach again, in memory and in the state
//! store, and a client that ends sessions while their scripts run could grow both without bound.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{Gate, PolicySet, Registry};
use codemode_runtime::{Cells, CellsConfig, Codemode, ScriptRequest};
use codemode_spec::ToolSpec;
use common::Slow;
use serde_json::json;
use tokio::sync::Semaphore;

async fn ended_mid_script(durable: Option<Arc<dyn codemode_state::StateStore>>) -> Codemode {
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let registry = Registry::new();
    registry
        .register(Arc::new(Slow {
            spec: ToolSpec::new("slow", "waits", json!({"type": "object"})),
            started: started.clone(),
            release: release.clone(),
        }))
        .unwrap();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p.cedar", "permit(principal, action, resource);").unwrap())
        .build()
        .unwrap();
    let mut builder = Codemode::builder().gate(gate);
    if let Some(store) = durable {
        builder = builder.cells(Cells::new(CellsConfig::new(store)));
    }
    let codemode = builder.build().unwrap();
    let running = {
        let codemode = codemode.clone();
        let code = "await tools.slow({}); store('k', 'x'.repeat(1000)); return 1";
        tokio::spawn(async move { codemode.run_script(ScriptRequest::new(code, "s")).await })
    };
    tokio::time::timeout(Duration::from_secs(10), started.acquire())
        .await
        .expect("the slow call starts within 10 s")
        .unwrap()
        .forget();
    // The session ends (its client's DELETE, idle expiry, eviction) while the script runs.
    codemode.end_session("s");
    release.add_permits(1);
    let run = running.await.unwrap();
    assert!(
        run.is_error,
        "the script's writes were not kept, and it says so: {}",
        run.text
    );
    codemode
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_ending_after_its_session_ended_keeps_no_store_values_in_memory() {
    let codemode = ended_mid_script(None).await;
    assert!(codemode.session_store("s").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_ending_after_its_session_ended_keeps_no_store_values_in_the_state_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    let codemode = ended_mid_script(Some(store.clone())).await;
    // The session's delete runs in the background: give it up to 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = store.load_store("s").await.unwrap();
        if left.is_empty() || std::time::Instant::now() > deadline {
            assert!(left.is_empty(), "{left:?}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(codemode.session_store("s").is_empty());
}
