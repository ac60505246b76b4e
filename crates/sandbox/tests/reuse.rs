//! A VM is prepared once and reset to its saved image after every script. These tests run
//! scripts one after another on a pool of exactly one VM, so every script runs where the previous
//! one ran, and attack the reset: whatever the first script leaves behind must be gone.

mod common;

use codemode_sandbox::*;
use common::*;
use serde_json::json;

fn one_vm() -> Sandbox {
    cached("one-vm", || SandboxConfig {
        defaults: Limits {
            heap_bytes: 32 << 20,
            ..Limits::default()
        },
        warm: 1,
        max_concurrent: 1,
        ..Default::default()
    })
}

async fn run(src: &str) -> ScriptResult {
    one_vm().run(script(src)).await
}

async fn nothing_of_one_script_reaches_the_next() {
    // Every way a script can leave state behind in its VM, then a check on the same VM.
    let leave = r#"
        globalThis.leftOver = { secret: 42 };
        var declared = "secret";
        Object.defineProperty(globalThis, "hidden", { value: 1, enumerable: false, configurable: false });
        const s = Symbol.for("codemode-secret");
        try { Object.prototype.polluted = 1; } catch (_) {}
        try { Array.prototype.push = () => 0; } catch (_) {}
        /(sec)ret/.exec("secret");
        new Promise(() => {});
        Promise.resolve().then(() => { globalThis.late = 1; });
        const keep = []; for (let i = 0; i < 1000; i++) keep.push("x".repeat(1000) + i);
        return 1"#;
    let check = r#"
        return [typeof leftOver, typeof declared, typeof hidden, typeof late, ({}).polluted,
                [1].push(2), Object.keys(globalThis).filter(k => !["tools", "ALL_TOOLS", "console",
                "text", "image", "textOf", "exit", "store", "load"].includes(k))]"#;
    for _ in 0..3 {
        let r = run(leave).await;
        assert_eq!(r.value, Some(json!(1)), "{:?}", r.error);
        let r = run(check).await;
        assert_eq!(
            r.value,
            Some(json!([
                "undefined",
                "undefined",
                "undefined",
                "undefined",
                null,
                2,
                []
            ])),
            "{:?}",
            r.error
        );
    }
}

async fn math_random_does_not_repeat_from_script_to_script() {
    // Each script starts from the same saved image, engine state included: the generator must
    // be seeded per script.
    let a = run("return [Math.random(), Math.random()]").await.value;
    let b = run("return [Math.random(), Math.random()]").await.value;
    assert!(a.is_some());
    assert_ne!(a, b);
}

async fn the_heap_of_a_script_that_filled_it_is_all_back_for_the_next() {
    let fill = "const a = []; while (true) a.push(new Array(1e5).fill(a.length))";
    let use_most = "const a = []; for (let i = 0; i < 12; i++) a.push(new Array(1e5).fill(i)); return a.length";
    for _ in 0..3 {
        let r = run(fill).await;
        assert!(
            r.error
                .as_ref()
                .is_some_and(|e| e.message.contains("out of memory")),
            "{:?}",
            r.error
        );
        let r = run(use_most).await;
        assert_eq!(r.value, Some(json!(12)), "{:?}", r.error);
    }
}

async fn a_script_stopped_mid_job_leaves_nothing_behind() {
    // Stopped by its deadline with jobs queued and a call in flight.
    let r = run(
        "// @options: {\"timeout_ms\": 200}\nglobalThis.x = 1; Promise.resolve().then(() => { while (true) {} }); await tools.echo({}); while (true) {}",
    )
    .await;
    assert!(r.error.is_some());
    let r = run("return typeof x").await;
    assert_eq!(r.value, Some(json!("undefined")), "{:?}", r.error);
}

async fn hundreds_of_scripts_on_one_vm_stay_correct() {
    for i in 0..300 {
        let r = run(&format!(
            "globalThis.g = {i}; const r = await tools.echo({{ i: {i} }}); return r.i + (typeof h === 'undefined' ? 0 : 1e6)"
        ))
        .await;
        assert_eq!(r.value, Some(json!(i)), "{:?}", r.error);
    }
}

both_modes!(
    nothing_of_one_script_reaches_the_next,
    math_random_does_not_repeat_from_script_to_script,
    the_heap_of_a_script_that_filled_it_is_all_back_for_the_next,
    a_script_stopped_mid_job_leaves_nothing_behind,
    hundreds_of_scripts_on_one_vm_stay_correct,
);
