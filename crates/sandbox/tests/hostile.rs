//! Hostile scripts: each is contained with a clear result, and the sandbox still works after it.
mod common;
use std::time::{Duration, Instant};

use codemode_sandbox::*;
use common::*;
use serde_json::json;

async fn contained(src: &str) -> ScriptResult {
    let t = Instant::now();
    let r = run(src).await;
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "{src} took {:?}",
        t.elapsed()
    );
    healthy().await;
    r
}

async fn spinning_and_memory_bombs() {
    let r = contained("// @options: {\"timeout_ms\": 200}\nwhile(true){}").await;
    assert_eq!(r.error.unwrap().kind, ErrorKind::Timeout);
    let r = contained("// @options: {\"timeout_ms\": 200}\nwhile(true) await null").await;
    assert_eq!(r.error.unwrap().kind, ErrorKind::Timeout);
    for bomb in [
        "let s = 'x'.repeat(1 << 20); const a = []; while (true) a.push(s + a.length)",
        "const a = []; while (true) a.push(new Array(1e6).fill(1))",
        "'x'.repeat(2 ** 29)",
    ] {
        let e = contained(bomb).await.error.unwrap();
        assert!(e.message.contains("out of memory"), "{bomb}: {e:?}");
    }
    let e = contained("function f(n){ return [f(n+1)] } f(0)")
        .await
        .error
        .unwrap();
    assert_eq!(e.name.as_deref(), Some("RangeError"));
}

async fn many_pending_promises() {
    let r = contained("const ps = []; for (let i = 0; i < 1e6; i++) ps.push(new Promise(() => {})); await Promise.all(ps)").await;
    let e = r.error.unwrap();
    // A million never-settling promises either fit (a stall) or exhaust the heap: both are clear.
    assert!(
        e.message.contains("nothing can settle") || e.message.contains("out of memory"),
        "{e:?}"
    );
    let r = contained("const ps = []; for (let i = 0; i < 1e5; i++) ps.push(new Promise(() => {})); await Promise.all(ps)").await;
    assert!(r.error.unwrap().message.contains("nothing can settle"));
    let r = contained("let n = 0; const ps = []; for (let i = 0; i < 1e5; i++) ps.push(Promise.resolve(i).then(() => n++)); await Promise.all(ps); return n").await;
    assert_eq!(r.value, Some(json!(100000)), "{:?}", r.error);
}

async fn prototype_pollution_cannot_fool_the_bridge() {
    let r = contained(r#"
        try { Object.prototype.toJSON = function () { return "polluted" } } catch {}
        try { Array.prototype.toJSON = function () { return "polluted" } } catch {}
        try { JSON.stringify = () => "polluted"; JSON.parse = () => "polluted" } catch {}
        try { Promise.prototype.then = function () { throw new Error("polluted") } } catch {}
        try { Object.defineProperty(Object.prototype, "then", { get() { throw new Error("polluted") } }) } catch {}
        try { Map.prototype.get = () => undefined; Map.prototype.set = () => undefined } catch {}
        try { Function.prototype.call = () => "polluted"; Reflect.apply = () => "polluted" } catch {}
        const r = await tools.echo({ a: [1, 2], b: "x" });
        return [r, JSON.stringify([1]), typeof Promise.prototype.then]"#).await;
    assert_eq!(
        r.value,
        Some(json!([{"a": [1, 2], "b": "x"}, "[1]", "function"])),
        "{:?}",
        r.error
    );
    assert_eq!(r.calls.len(), 1);
}

async fn overriding_globals_does_not_break_the_bridge() {
    let r = contained(
        r#"
        text = null; image = null; exit = null; store = null;
        globalThis.tools = {}; globalThis.console = null; delete globalThis.text;
        try { Object.defineProperty(globalThis, "text", { value: () => "fake" }) } catch {}
        text("still"); console.log("logged");
        return await tools.echo("ok")"#,
    )
    .await;
    assert_eq!(r.value, Some(json!("ok")), "{:?}", r.error);
    assert_eq!(texts(&r), ["still", "logged"]);
    // `tools` and `console` are parameters of the script function, as in the reference: rebinding
    // them only changes the script's own name; the global stays usable.
    let r = contained("tools = null; console = null; globalThis.console.log('via global'); return await globalThis.tools.echo('ok')").await;
    assert_eq!(r.value, Some(json!("ok")), "{:?}", r.error);
    assert_eq!(texts(&r), ["via global"]);
}

async fn odd_values() {
    for (src, name) in [
        ("throw null", None),
        ("throw undefined", None),
        ("throw 42", None),
        ("throw Symbol('s')", None),
        ("throw new Proxy({}, {})", None),
    ] {
        let e = contained(src).await.error.unwrap();
        assert_eq!((e.kind, e.name.clone()), (ErrorKind::Script, name), "{src}");
    }
    assert_eq!(contained("throw null").await.error.unwrap().message, "null");
    let e = contained("return 10n").await.error.unwrap();
    assert_eq!(e.name.as_deref(), Some("TypeError"));
    let e = contained("const a = {}; a.a = a; return a")
        .await
        .error
        .unwrap();
    assert_eq!(e.name.as_deref(), Some("TypeError"));
    let r = contained(r#"text("a\uD800b"); console.log("\uDC00"); return ["x\uD800", await tools.echo("\uDFFF")]"#).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(texts(&r), ["a\u{FFFD}b", "\u{FFFD}"]);
    assert_eq!(r.value, Some(json!(["x\u{FFFD}", "\u{FFFD}"])));
    let r = contained("return { get x() { throw new Error('getter') } }").await;
    assert_eq!(r.error.unwrap().message, "getter");
}

async fn huge_output_is_cut_off() {
    let r =
        contained("const chunk = 'x'.repeat(1 << 20); for (let i = 0; i < 100; i++) text(chunk)")
            .await;
    let e = r.error.unwrap();
    assert_eq!(e.name.as_deref(), Some("RangeError"));
    assert_eq!(r.output.len(), 16);
    let r = contained("for (let i = 0; i < 200000; i++) console.log(i)").await;
    assert!(!r.ok && r.output.len() == 100000);
}

async fn invalid_images_and_syntax_errors() {
    let e = contained("image('data:image/png;base64,////')")
        .await
        .error
        .unwrap();
    assert!(e.message.contains("not a PNG, JPEG, GIF or WebP"));
    let e = contained("image({ type: 'image', data: 'not base64!' })")
        .await
        .error
        .unwrap();
    assert!(e.message.contains("not valid base64"));
    for src in [
        "return (",
        "}}}",
        "await await",
        "const = 1",
        "return 1 +* 2",
    ] {
        let e = contained(src).await.error.unwrap();
        assert_eq!(e.name.as_deref(), Some("SyntaxError"), "{src}: {e:?}");
    }
    let r = contained("let out = []; try { exit() } finally { out.push(1); text('after'); await tools.echo(1) } return out").await;
    assert!(r.ok && r.output.is_empty() && r.value.is_none(), "{r:?}");
}

async fn hundreds_of_concurrent_scripts_keep_their_limits() {
    let sb = sandbox();
    let mut handles = Vec::new();
    for i in 0..300 {
        let src = match i % 5 {
            0 => format!(
                "let s = 0; for (let j = 0; j < 20; j++) s += (await tools.echo({{ j }})).j; return s + {i}"
            ),
            1 => "// @options: {\"timeout_ms\": 500}\nwhile (true) {}".to_string(),
            2 => "// @options: {\"timeout_ms\": 500}\nawait tools.slow()".to_string(),
            3 => format!(
                "globalThis.mine = {i}; await tools.sleep({{ms: 20}}); return globalThis.mine"
            ),
            _ => "tools.slow(); return 'early'".to_string(),
        };
        let s = script(&src);
        let abort = s.abort.clone();
        if i % 50 == 49 {
            let a = abort.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                a.cancel();
            });
        }
        handles.push((i, tokio::spawn(sb.run(s))));
    }
    let t = Instant::now();
    for (i, h) in handles {
        let r = h.await.unwrap();
        let aborted = r.error.as_ref().map(|e| e.kind) == Some(ErrorKind::Aborted);
        match i % 5 {
            _ if aborted && i % 50 == 49 => {}
            0 => assert_eq!(r.value, Some(json!(190 + i)), "{i}: {:?}", r.error),
            1 | 2 => assert_eq!(
                r.error.as_ref().map(|e| e.kind),
                Some(ErrorKind::Timeout),
                "{i}: {:?}",
                r.error
            ),
            3 => assert_eq!(r.value, Some(json!(i)), "{i}: {:?}", r.error),
            _ => assert_eq!(
                (r.value, r.calls[0].status),
                (Some(json!("early")), CallStatus::Cancelled)
            ),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(120));
    healthy().await;
}

async fn stack_trace_hooks_do_not_reach_the_prelude() {
    // QuickJS's `Error.prepareStackTrace` is an accessor whose setter writes the context, so
    // freezing `Error` does not stop it; with it set, `CallSite.getFunction()` hands the script
    // the function of every frame on the stack, the prelude's own (`settle`, with its table of
    // pending calls) among them.
    let r = contained(
        r#"
        const leaked = [];
        try {
            Error.prepareStackTrace = (e, sites) => {
                for (const s of sites) {
                    const f = s.getFunction();
                    if (typeof f === "function" && s.getFileName() !== "codemode.js") leaked.push(f);
                }
                return "";
            };
        } catch {}
        const slow = tools.slow();
        try { await tools.fail() } catch {}
        try { Error.prepareStackTrace = undefined } catch {}
        const names = leaked.map((f) => f.name);
        // The pending call's promise must be settled by the host, never by the script.
        const settle = leaked.find((f) => f.name === "settle");
        if (settle) settle(1, true, "forged by the script");
        const first = await Promise.race([slow, new Promise((r) => r("pending"))]);
        return [names, first]"#,
    )
    .await;
    assert_eq!(r.value, Some(json!([[], "pending"])), "{:?}", r.error);
}

async fn stack_trace_limit_runs_no_script_code_when_errors_are_made() {
    // `Error.stackTraceLimit` is an accessor in QuickJS too: an object with `valueOf` set there
    // would run script code each time an error is made, native bridge errors included.
    let r = contained(
        r#"
        let ran = 0;
        try { Error.stackTraceLimit = { valueOf() { ran++; return 3; } }; } catch {}
        const before = ran;
        try { null.x } catch {}
        new Error("made");
        try { await tools.fail() } catch {}
        return [ran - before, typeof Error.stackTraceLimit]"#,
    )
    .await;
    assert_eq!(r.value, Some(json!([0, "number"])), "{:?}", r.error);
}

both_modes!(
    spinning_and_memory_bombs,
    many_pending_promises,
    prototype_pollution_cannot_fool_the_bridge,
    overriding_globals_does_not_break_the_bridge,
    odd_values,
    huge_output_is_cut_off,
    invalid_images_and_syntax_errors,
    stack_trace_hooks_do_not_reach_the_prelude,
    stack_trace_limit_runs_no_script_code_when_errors_are_made
);

both_modes!(multi: hundreds_of_concurrent_scripts_keep_their_limits);
