//! What one script can make the host process hold. Its own heap is capped in the worker, but the
//! host decodes its call arguments and returned value into `serde_json::Value`s, which take 16
//! and more bytes for every 2 bytes of JSON (`0,`): without a bound on what is decoded, a script
//! within its heap limit makes the host take gigabytes, and every session of it dies with it.
//! Its own file, so that the peak memory it reads is this test's alone.
use std::sync::Arc;

use codemode_sandbox::*;
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::Value;

/// Answers every call with an error at once, keeping nothing of it.
struct Refuse;

impl Host for Refuse {
    fn call(&self, _call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        async { Err(HostError::new("refused")) }.boxed_local()
    }
}

/// Holds every call, arguments and all, until the script ends.
struct Hold;

impl Host for Hold {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        async move {
            // As a real host holds a call's arguments while it runs (a gated call, its approval).
            call.cancel.cancelled().await;
            drop(call.args);
            Err(HostError::new("cancelled"))
        }
        .boxed_local()
    }
}

/// One warm worker process: what the host holds is measured in this (the host's) process.
fn process_sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        isolation: Isolation::Process,
        warm: 1,
        ..Default::default()
    })
    .unwrap()
}

/// The peak resident memory of this process so far, in MiB.
fn peak_mib() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_maxrss / 1024
}

#[tokio::test]
async fn arguments_and_results_cannot_take_the_hosts_memory() {
    let sb = process_sandbox();
    let host = Arc::new(Refuse);
    let run =
        |src: &str| sb.run(Script::new(src, host.clone()).with_tools([("sink", "Takes anything")]));
    let r = run("return 1").await;
    assert_eq!(r.value, Some(serde_json::json!(1)), "{:?}", r.error);
    let before = peak_mib();
    // 8 million zeros: 128 MiB of the script's 256 MiB heap, 16 MB of JSON.
    let r = run("const a = new Array(8e6).fill(0); try { await tools.sink(a) } catch (e) { return e.message }").await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let after_call = peak_mib();
    let r = run("return new Array(8e6).fill(0)").await;
    assert!(r.error.is_some() || r.value.is_some());
    let after_return = peak_mib();
    // The JSON text itself crosses (16 MB, a few copies); decoding must not multiply it.
    assert!(
        after_call - before < 100 && after_return - before < 100,
        "the host's peak memory grew by {} MiB for a call's arguments, {} MiB with a returned value",
        after_call - before,
        after_return - before
    );
}

#[tokio::test]
async fn store_writes_cannot_take_the_hosts_memory() {
    // A million writes of one small key are within the store's size limits and the script's
    // heap; the host decodes the writes the VM sends.
    let (grew, r) =
        growth_of_store_script("for (let i = 0; i < 1e6; i++) store('k', i); return 1").await;
    assert!(
        grew < 100,
        "the host's peak memory grew by {grew} MiB for {} store writes",
        r.store_writes.len()
    );
}

/// Red team: 300 writes of one 262,000-character value made the host hold 285 MB (360 crashed
/// the worker). Only the last write of a key is sent.
#[tokio::test]
async fn repeated_writes_of_a_big_value_cannot_take_the_hosts_memory() {
    let (grew, r) = growth_of_store_script(
        r#"const v="x".repeat(262000); for (let i=0;i<360;i++) store("k", v); return "ok""#,
    )
    .await;
    assert_eq!(r.value, Some(serde_json::json!("ok")), "{:?}", r.error);
    assert_eq!(r.store_writes.len(), 1);
    assert!(
        grew < 50,
        "the host's peak memory grew by {grew} MiB for 360 writes of one key"
    );
}

/// How much the host's peak memory grew (MiB) while `src` ran, after a first script warmed
/// the sandbox, and what it returned.
async fn growth_of_store_script(src: &str) -> (i64, ScriptResult) {
    let sb = process_sandbox();
    let host = Arc::new(Refuse);
    let r = sb.run(Script::new("return 1", host.clone())).await;
    assert_eq!(r.value, Some(serde_json::json!(1)), "{:?}", r.error);
    let before = peak_mib();
    let r = sb.run(Script::new(src, host)).await;
    (peak_mib() - before, r)
}

/// How much the host's peak memory grew (MiB) while `src` ran with calls to `hold` that wait
/// until the script ends, and what the script returned.
async fn growth_with_calls_held(src: &str) -> (i64, ScriptResult) {
    let sb = process_sandbox();
    let host = Arc::new(Hold);
    let run = |src: &str| sb.run(Script::new(src, host.clone()).with_tools([("hold", "Waits")]));
    let r = run("return 1").await;
    assert_eq!(r.value, Some(serde_json::json!(1)), "{:?}", r.error);
    let before = peak_mib();
    let r = run(src).await;
    (peak_mib() - before, r)
}

#[tokio::test]
async fn calls_in_flight_cannot_take_the_hosts_memory_together() {
    // Each call's arguments are within the bound on one call; forty of them wait together,
    // each decoded and held by the host until the script ends.
    let (grew, r) = growth_with_calls_held(
        "const a = new Array(9e5).fill(0); const ps = []; for (let i = 0; i < 40; i++) ps.push(tools.hold(a).catch((e) => e.message)); return await Promise.race([...ps, Promise.resolve('returned')])",
    )
    .await;
    assert!(
        grew < 200,
        "the host's peak memory grew by {grew} MiB for calls in flight ({:?})",
        r.error
    );
}

/// A long string is one JSON value, so counting values does not bound it: twelve calls of a
/// 40 MB string each, all waiting, would make the host hold 480 MB (and the gate copies a
/// waiting call's arguments a few times more).
#[tokio::test]
async fn long_strings_in_flight_cannot_take_the_hosts_memory_together() {
    let (grew, r) = growth_with_calls_held(
        "// @options: {\"timeout_ms\": 30000}\nconst s = 'x'.repeat(40e6); const ps = []; for (let i = 0; i < 12; i++) ps.push(tools.hold({ s }).catch((e) => e.message)); return await ps[1]",
    )
    .await;
    assert!(
        grew < 200,
        "the host's peak memory grew by {grew} MiB for calls in flight ({:?})",
        r.error
    );
    let said = r.value.as_ref().and_then(Value::as_str).unwrap_or_default();
    assert!(
        said.contains("bytes of JSON together") && said.contains("Await some of them"),
        "a call past the bound is refused, saying what to do: {said:?} ({:?})",
        r.error
    );
}
