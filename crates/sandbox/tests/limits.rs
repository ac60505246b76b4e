mod common;
use std::time::{Duration, Instant};

use codemode_sandbox::*;
use common::*;
use serde_json::json;

fn small() -> Sandbox {
    cached("small", || {
        let defaults = Limits {
            heap_bytes: 64 * 1024 * 1024,
            max_calls: 50,
            max_calls_in_flight: 10,
            cpu_ms: 2_000,
            ..Limits::default()
        };
        SandboxConfig {
            defaults,
            warm: 1,
            ..Default::default()
        }
    })
}

async fn run_small(src: &str) -> ScriptResult {
    small().run(script(src)).await
}

async fn deadline_stops_spinning_and_awaiting_scripts() {
    for src in [
        "while (true) {}",
        "while (true) await null",
        "while (true) { try { while (true) {} } catch {} }",
        "await tools.slow()",
    ] {
        let t = Instant::now();
        let r = run(&format!("// @options: {{\"timeout_ms\": 300}}\n{src}")).await;
        let e = r.error.clone().unwrap();
        assert_eq!(e.kind, ErrorKind::Timeout, "{src}: {e:?}");
        assert_eq!(e.message, "Execution timed out after 300 ms");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{src} took {:?}",
            t.elapsed()
        );
        assert_eq!(r.limits.timeout_ms, 300);
    }
    let r = run("// @options: {\"timeout_ms\": 300}\nawait tools.slow()").await;
    assert_eq!(r.calls[0].status, CallStatus::Cancelled);
    healthy().await;
}

async fn cpu_budget_stops_code_that_never_yields() {
    let t = Instant::now();
    let e = run_small("let x = 0; while (true) { x++ }")
        .await
        .error
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(e.message.contains("CPU budget of 2000 ms"), "{}", e.message);
    assert!(t.elapsed() < Duration::from_secs(10));
    // Time spent waiting on calls does not count against the CPU budget.
    let r = run_small("await tools.sleep({ms: 2500}); return 1").await;
    assert_eq!(r.value, Some(json!(1)), "{:?}", r.error);
}

async fn approval_pauses_do_not_count_against_the_deadline() {
    let s =
        script("// @options: {\"timeout_ms\": 300}\nawait tools.sleep({ms: 600}); return 'done'");
    let clock = s.clock.clone();
    let pause = clock.pause();
    let handle = tokio::spawn(sandbox().run(s));
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(pause);
    let r = handle.await.unwrap();
    assert_eq!(r.value, Some(json!("done")), "{:?}", r.error);
}

async fn abort_stops_even_a_spinning_script() {
    for src in [
        "while (true) {}",
        "await tools.slow()",
        "while (true) await null",
    ] {
        let s = script(src);
        let abort = s.abort.clone();
        let handle = tokio::spawn(sandbox().run(s));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        abort.cancel();
        let r = handle.await.unwrap();
        assert_eq!(r.error.as_ref().unwrap().kind, ErrorKind::Aborted, "{src}");
        // Far below the 60 s default deadline, with room for a loaded 2-core machine.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{src}: {:?}",
            t.elapsed()
        );
        if src.contains("slow") {
            assert_eq!(r.calls[0].status, CallStatus::Cancelled);
        }
    }
    let s = script("return 1");
    s.abort.cancel();
    assert_eq!(
        sandbox().run(s).await.error.unwrap().kind,
        ErrorKind::Aborted
    );
    healthy().await;
}

async fn memory_limit_is_catchable_and_reported_when_not() {
    let v = run_small(r#"let a=[]; try { while(true) a.push("x".repeat(1<<20)+a.length) } catch(e) { const n=a.length; a=null; return [String(e), n] }"#).await;
    let v = v.value.unwrap();
    assert_eq!(v[0], json!("InternalError: out of memory"));
    assert!(v[1].as_u64().unwrap() < 64);
    for src in [
        r#"let a=[]; while(true) a.push("x".repeat(1<<20)+a.length)"#,
        "const big = 'x'.repeat(2 ** 27); return big.length",
        "const a = []; while (true) a.push({ i: a.length, t: 'row' })",
        "new Array(1e9).fill(0)",
    ] {
        let e = run_small(src).await.error.unwrap();
        assert_eq!(
            (e.kind, e.name.as_deref()),
            (ErrorKind::Script, Some("InternalError")),
            "{src}: {e:?}"
        );
        assert!(e.message.contains("out of memory"), "{src}: {}", e.message);
    }
    assert_eq!(small().run(script("return 1")).await.value, Some(json!(1)));
}

async fn stack_overflow_is_a_catchable_range_error() {
    let v = value("let d=0; function f(){d++; f()} try{f()}catch(e){return [e.name, d]}").await;
    assert_eq!(v[0], json!("RangeError"));
    assert!(v[1].as_u64().unwrap() > 1000, "{v}");
    let e = error("function f(){ return f() + 1 } f()").await;
    assert_eq!(e.name.as_deref(), Some("RangeError"));
    healthy().await;
}

async fn output_limits() {
    let r = run(r#"try { for (let i=0;i<100001;i++) text("") } catch (e) { text("caught"); return "caught" }"#).await;
    let e = r.error.clone().unwrap();
    assert_eq!(e.name.as_deref(), Some("RangeError"));
    assert_eq!(
        e.message,
        "script output exceeded the limit of 16777216 characters or 100000 text(), image(), and console calls. Print a summary instead, or write large data to a file with a tool."
    );
    assert_eq!(r.output.len(), 100000);
    let r = run(r#"text("x".repeat(16*1024*1024)); text("y")"#).await;
    assert!(!r.ok);
    assert_eq!(r.output.len(), 1);
    let r = run(r#"text("x".repeat(16*1024*1024 - 1)); return 1"#).await;
    assert!(r.ok, "exactly the limit is allowed, return value included");
    let r = run(r#"text("x".repeat(16*1024*1024)); return 1"#).await;
    assert!(!r.ok, "the return value counts against the output limit");
    healthy().await;
}

async fn call_limits() {
    let r = run_small("let n = 0; try { for (let i = 0; i < 100; i++) { await tools.echo(i); n++ } } catch (e) { return [n, e.message] }").await;
    let v = r.value.unwrap();
    assert_eq!(v[0], json!(50));
    assert!(v[1].as_str().unwrap().contains("at most 50"), "{v}");
    let r = run_small("const ps = []; for (let i = 0; i < 11; i++) ps.push(tools.sleep({ms: 20})); const s = await Promise.allSettled(ps); return s.map(x => x.status)").await;
    let v = r.value.unwrap();
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .filter(|s| *s == "rejected")
            .count(),
        1,
        "{v}"
    );
    let r = run_small("try { await Promise.all(Array.from({length: 11}, () => tools.sleep({ms: 5}))) } catch (e) { return e.message }").await;
    assert!(
        r.value
            .unwrap()
            .as_str()
            .unwrap()
            .contains("Too many calls at once")
    );
}

both_modes!(
    deadline_stops_spinning_and_awaiting_scripts,
    cpu_budget_stops_code_that_never_yields,
    approval_pauses_do_not_count_against_the_deadline,
    abort_stops_even_a_spinning_script,
    memory_limit_is_catchable_and_reported_when_not,
    stack_overflow_is_a_catchable_range_error,
    output_limits,
    call_limits
);
