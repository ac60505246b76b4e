mod common;
use std::sync::Arc;

use codemode_sandbox::*;
use common::*;
use futures::future::LocalBoxFuture;
use serde_json::{Value, json};

fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
fn assert_send_static<T: Send + 'static>(_: &T) {}

#[test]
fn sandbox_is_shareable_and_run_is_send() {
    for mode in [Isolation::Process, Isolation::Thread] {
        set_mode(mode);
        shareable_and_send();
    }
}

fn shareable_and_send() {
    assert_send_sync::<Sandbox>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fut = sandbox().run(script("return 1"));
    assert_send_static(&fut);
    assert_eq!(rt.block_on(fut).value, Some(json!(1)));
}

struct PanickyHost;
impl Host for PanickyHost {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        if call.name == "now" {
            panic!("host bug");
        }
        Box::pin(async move { panic!("host bug later") })
    }
}

async fn a_panicking_host_fails_the_call_not_the_process() {
    let s = Script::new(
        "const out = []; for (const t of ['now', 'later']) { try { await tools[t]() } catch (e) { out.push(e.message) } } return out",
        Arc::new(PanickyHost),
    )
    .with_tools([("now", ""), ("later", "")]);
    let r = sandbox().run(s).await;
    let v = r.value.unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    assert!(v[0].as_str().unwrap().contains("host failed"));
    healthy().await;
}

#[test]
fn bad_configuration_is_refused() {
    assert!(
        Sandbox::new(SandboxConfig {
            max_concurrent: 0,
            ..Default::default()
        })
        .is_err()
    );
    // A worker that cannot be started is a clear error, never a silent fall back to threads.
    let e = Sandbox::new(SandboxConfig {
        worker_program: Some(WorkerProgram {
            path: "/nonexistent/codemode".into(),
            args: vec![],
        }),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("/nonexistent/codemode")
            && e.contains("worker_program")
            && e.contains("thread isolation"),
        "{e}"
    );
    let e = Sandbox::new(SandboxConfig {
        worker_program: Some(WorkerProgram {
            path: "/bin/true".into(),
            args: vec![],
        }),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("did not start"), "{e}");
    let defaults = Limits {
        heap_bytes: 1000,
        ..Default::default()
    };
    assert!(
        Sandbox::new(SandboxConfig {
            defaults,
            ..Default::default()
        })
        .is_err()
    );
}

struct RawJsonHost;
impl Host for RawJsonHost {
    fn call(&self, _call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        Box::pin(async { Ok(json!("unused")) })
    }
    fn call_json(&self, call: HostCall) -> LocalBoxFuture<'static, Result<String, HostError>> {
        let text = if call.name == "good" {
            r#"{"rows":[1,2,3]}"#
        } else {
            "{not json"
        };
        Box::pin(async move { Ok(text.to_string()) })
    }
}

async fn hosts_may_answer_with_json_text() {
    let s = Script::new(
        "const g = await tools.good(); try { await tools.bad() } catch (e) { return [g, e.name, e.message] }",
        Arc::new(RawJsonHost),
    )
    .with_tools([("good", ""), ("bad", "")]);
    let r = sandbox().run(s).await;
    assert_eq!(
        r.value,
        Some(
            json!([{"rows": [1, 2, 3]}, "TypeError", "The host answered call 2 with text that is not valid JSON."])
        ),
        "{:?}",
        r.error
    );
}

both_modes!(
    a_panicking_host_fails_the_call_not_the_process,
    hosts_may_answer_with_json_text
);
