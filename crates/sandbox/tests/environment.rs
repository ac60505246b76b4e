mod common;
use codemode_sandbox::*;
use common::*;
use serde_json::json;

async fn values_text_and_console() {
    let r = run(r#"text(undefined); text(null); text(7); text(NaN); text("s"); text({a:1}); text([1,undefined]); text(()=>1); text(Symbol("q"))"#).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        texts(&r),
        [
            "undefined",
            "null",
            "7",
            "NaN",
            "s",
            "{\"a\":1}",
            "[1,null]",
            "()=>1",
            "Symbol(q)"
        ]
    );
    let r = run(r#"console.log("a", 1, {a:1}, NaN, -Infinity, undefined, null)"#).await;
    assert_eq!(
        r.output,
        vec![OutputItem::Text {
            text: "a 1 {\"a\":1} NaN -Infinity undefined null".into(),
            console: true
        }]
    );
    let r = run(r#"console.error(new TypeError("bad"))"#).await;
    let t = &texts(&r)[0];
    assert!(
        t.starts_with("TypeError: bad\n    at ") && t.contains("codemode.js:1:"),
        "{t}"
    );
    assert_eq!(
        value(r#"const c={}; c.c=c; try { text(c) } catch (e) { return e.name }"#).await,
        json!("TypeError")
    );
    let e = error("return 10n").await;
    assert_eq!(
        (e.kind, e.name.as_deref()),
        (ErrorKind::Script, Some("TypeError"))
    );
    let e = error("throw { code: 7 }").await;
    assert_eq!(
        (e.message.as_str(), e.name.is_none(), e.stack.is_none()),
        ("{\"code\":7}", true, true)
    );
    assert_eq!(error("throw 'plain'").await.message, "plain");
    let e = error("const a = 1;\nconst b = ;\nreturn a").await;
    assert_eq!(e.name.as_deref(), Some("SyntaxError"));
    assert!(
        e.stack.as_deref().unwrap_or("").contains("codemode.js:2"),
        "{e:?}"
    );
    let r = run("console.log(new Error('inner'));\nthrow new RangeError('outer')").await;
    let e = r.error.clone().unwrap();
    let stack = e.stack.unwrap();
    assert!(
        stack.starts_with("RangeError: outer\n    at ") && stack.contains("codemode.js:2"),
        "{stack}"
    );
    assert!(
        texts(&r)[0].starts_with("Error: inner\n    at ") && texts(&r)[0].contains("codemode.js:1")
    );
    assert!(!stack.contains("prelude"));
    let e = error(r#"class MyError extends Error { constructor(m){ super(m); this.name = "MyError" } } throw new MyError("m")"#).await;
    assert_eq!(
        (e.name.as_deref(), e.message.as_str()),
        (Some("MyError"), "m")
    );
    assert!(e.stack.unwrap().starts_with("MyError: m"));
    let e = error("// @options: {}\nthrow new Error(\"x\")").await;
    assert!(e.stack.unwrap().contains("codemode.js:2:"));
    healthy().await;
}

async fn tools_guard_and_identifiers() {
    let e = error("return await tools.missing()").await;
    assert_eq!(e.name.as_deref(), Some("TypeError"));
    assert!(e.message.starts_with("tools.missing is not a known name. Known names: echo, fail, slow, rows, sleep, fail_props, image_tool."), "{}", e.message);
    assert!(
        e.message.contains("Every tool is in ALL_TOOLS")
            && e.message
                .ends_with("await searchTools(\"topic\") finds tools by what they do.")
    );
    let e = error("tools.Echo").await;
    assert!(
        e.message
            .starts_with("tools.Echo is not a known name. Closest: tools.echo."),
        "{}",
        e.message
    );
    assert_eq!(value(r#"return ["missing" in tools, "echo" in tools, typeof tools.then, typeof tools.toJSON]"#).await, json!([false, true, "undefined", "undefined"]));
    assert_eq!(
        error("return typeof tools.extra").await.name.as_deref(),
        Some("TypeError")
    );
    assert_eq!(value("return await tools.echo(1, 2)").await, json!(1));
    assert_eq!(
        value("return [await tools.echo(), await tools.echo(null)]").await,
        json!([null, null])
    );
    assert_eq!(value("try{tools.echo=()=>'nope'}catch{} try{globalThis.tools=null}catch{} return await tools.echo('still')").await, json!("still"));
    // The proxy that explains a miss sits behind `tools` as its prototype: a script that finds
    // it can neither add a tool through it nor swap it, and `tools` itself stays frozen.
    assert_eq!(
        value(r#"const miss = Object.getPrototypeOf(tools);
            const tries = [];
            for (const f of [
                () => { miss.injected = () => "x"; },
                () => Object.defineProperty(miss, "injected", { value: () => "x" }),
                () => Object.setPrototypeOf(miss, { injected: () => "x" }),
                () => Object.setPrototypeOf(tools, { injected: () => "x" }),
                () => { tools.injected = () => "x"; },
                () => Object.defineProperty(tools, "echo", { value: () => "x" }),
            ]) { try { f(); tries.push("allowed"); } catch (e) { tries.push(e.name); } }
            let after;
            try { tools.injected(); after = "called"; } catch (e) { after = e.message.split(" Known")[0]; }
            return [tries, after, "injected" in tools, Object.isFrozen(tools), await tools.echo("ok")]"#).await,
        // Sloppy-mode assignments fail silently; what counts is that nothing changed.
        json!([["allowed", "TypeError", "TypeError", "TypeError", "allowed", "TypeError"],
               "tools.injected is not a known name.", false, true, "ok"])
    );
    assert_eq!(
        value("return ALL_TOOLS.map(t => t.name)").await,
        json!([
            "echo",
            "fail",
            "slow",
            "rows",
            "sleep",
            "fail_props",
            "image_tool"
        ])
    );
    assert_eq!(value("try { ALL_TOOLS.push(1) } catch {} return [ALL_TOOLS.length, Object.isFrozen(ALL_TOOLS), Object.isFrozen(ALL_TOOLS[0])]").await, json!([7, true, true]));

    let s = Script::new(
        "return [await tools.my_tool('a'), await tools['my-tool']('b')]",
        host(),
    )
    .with_tools([("my-tool", "Dashes"), ("echo", "e")]);
    let r = sandbox().run(s).await;
    assert_eq!(r.value, Some(json!(["a", "b"])));
    assert!(
        r.calls.iter().all(|c| c.name == "my-tool"),
        "the host sees the raw name"
    );
    let s = Script::new("return Object.keys(tools)", host())
        .with_tools([("my-tool", "Dashes"), ("echo", "e")]);
    assert_eq!(
        sandbox().run(s).await.value,
        Some(json!(["my_tool", "my-tool", "echo"]))
    );
    let s = Script::new("return 1", host())
        .with_tools([("my-tool", "Dashes"), ("my_tool", "Shadowed")]);
    let r = sandbox().run(s).await;
    let e = r.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Sandbox);
    assert!(
        e.message.contains("\"my-tool\"") && e.message.contains("\"my_tool\""),
        "{}",
        e.message
    );
    healthy().await;
}

async fn calls_errors_and_cancellation() {
    let r = run(
        "try { await tools.fail() } catch (e) { return [e instanceof Error, e.name, e.message] }",
    )
    .await;
    assert_eq!(r.value, Some(json!([true, "Error", "tool exploded"])));
    assert_eq!(r.calls.len(), 1);
    assert_eq!(
        (r.calls[0].name.as_str(), r.calls[0].status, r.calls[0].id),
        ("fail", CallStatus::Error, 1)
    );
    let e = error("await tools.fail()").await;
    assert_eq!(
        (e.kind, e.name.as_deref(), e.message.as_str()),
        (ErrorKind::Script, Some("Error"), "tool exploded")
    );
    assert_eq!(e.stack.as_deref(), Some("Error: tool exploded"));
    let r = run("try { await tools.echo(1n) } catch (e) { return e.name }").await;
    assert_eq!((r.value, r.calls.len()), (Some(json!("TypeError")), 0));
    let r =
        run("try { await tools.fail_props() } catch (e) { return [e.name, e.message, e.code] }")
            .await;
    assert_eq!(r.value, Some(json!(["ToolError", "nope", 7])));
    let before = host().cancelled.load(std::sync::atomic::Ordering::SeqCst);
    let r = run("tools.slow(); return 'early'").await;
    assert_eq!(r.value, Some(json!("early")));
    assert_eq!(r.calls[0].status, CallStatus::Cancelled);
    // The slow tool saw its token cancelled.
    for _ in 0..100 {
        if host().cancelled.load(std::sync::atomic::Ordering::SeqCst) > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(host().cancelled.load(std::sync::atomic::Ordering::SeqCst) > before);
    let r =
        run("return await Promise.all([tools.echo(1), tools.echo(2), tools.sleep({ms: 5})])").await;
    assert_eq!(r.value, Some(json!([1, 2, {"ms": 5}])));
    assert_eq!(
        r.calls.iter().map(|c| (c.id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, CallStatus::Ok),
            (2, CallStatus::Ok),
            (3, CallStatus::Ok)
        ]
    );
    assert_eq!(r.calls[0].args, "1");
    let e = error("await tools.echo(1); await new Promise(() => {}); return 'never'").await;
    assert_eq!(e.kind, ErrorKind::Script);
    assert!(
        e.message
            .contains("waiting on a promise that nothing can settle"),
        "{}",
        e.message
    );
    assert_eq!(value("tools.echo(2); return 'early'").await, json!("early"));
    let results = futures::future::join_all([
        run("globalThis.shared = 'a'; return globalThis.shared"),
        run("globalThis.shared = 'b'; return globalThis.shared"),
        run("return typeof globalThis.shared"),
    ])
    .await;
    let values: Vec<_> = results.into_iter().map(|r| r.value.unwrap()).collect();
    assert_eq!(values, vec![json!("a"), json!("b"), json!("undefined")]);
    healthy().await;
}

async fn host_globals_and_namespaces() {
    let mut s = script(
        "return [await searchTools('x', {limit: 2}), await models.classify('m', undefined), typeof models]",
    );
    s.globals = vec!["searchTools".into(), "models.classify".into()];
    let r = sandbox().run(s).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        r.value,
        Some(json!([
            {"global": "searchTools", "args": ["x", {"limit": 2}]},
            {"global": "models.classify", "args": ["m", null]},
            "object"
        ]))
    );
    assert!(r.calls.is_empty(), "globals are not recorded as tool calls");
    let mut s = script("return models.nope");
    s.globals = vec!["models.classify".into()];
    let e = sandbox().run(s).await.error.unwrap();
    assert!(
        e.message
            .starts_with("models.nope is not a known name. Known names: classify."),
        "{}",
        e.message
    );
    assert!(!e.message.contains("ALL_TOOLS"));
    for bad in ["store", "tools", "console", "not-valid", "a.b.c", "tools.x"] {
        let mut s = script("return 1");
        s.globals = vec![bad.into()];
        let e = sandbox().run(s).await.error.unwrap();
        assert_eq!(e.kind, ErrorKind::Sandbox);
        assert!(
            e.message.contains("Invalid global name"),
            "{bad}: {}",
            e.message
        );
    }
    let mut s = script("return 1");
    s.globals = vec!["models".into(), "models.list".into()];
    assert!(
        sandbox()
            .run(s)
            .await
            .error
            .unwrap()
            .message
            .contains("conflicts with the namespace")
    );
    healthy().await;
}

async fn exit_store_and_load() {
    let r = run(r#"text("before"); store("k", 1); await tools.echo(1); try { exit() } catch {} ; text("after"); return "x""#).await;
    assert!(r.ok && r.value.is_none(), "{r:?}");
    assert_eq!(texts(&r), ["before"]);
    assert_eq!(
        r.store_writes,
        vec![StoreWrite::Set {
            key: "k".into(),
            value: json!(1)
        }]
    );
    let r = run("try { exit() } finally { text('late'); }").await;
    assert!(r.ok && r.output.is_empty());
    let r = run("try { exit() } finally { while (true) {} }").await;
    assert!(
        r.ok,
        "exit() then a spinning finally still succeeds: {:?}",
        r.error
    );

    let mut s = script(
        r#"const s=load("counter"); store("counter", s+1); store("old", undefined); return [s, load("counter"), load("missing"), load("old")]"#,
    );
    s.store.insert("counter".into(), json!(41));
    s.store.insert("old".into(), json!("x"));
    let r = sandbox().run(s).await;
    assert_eq!(r.value, Some(json!([41, 42, null, null])));
    assert_eq!(
        r.store_writes,
        vec![
            StoreWrite::Set {
                key: "counter".into(),
                value: json!(42)
            },
            StoreWrite::Delete {
                key: "old".into(),
                delete: true
            }
        ]
    );
    let msgs = value(r#"const out = [];
        for (const f of [() => store(1, "x"), () => load({}), () => store("fn", () => 1), () => store("big", "x".repeat(300*1024)),
                         () => { for (let i = 0; i < 8; i++) store("k" + i, "y".repeat(200 * 1024)) }]) {
          try { f(); out.push("no error") } catch (e) { out.push(e.name + ": " + e.message) }
        }
        return out"#).await;
    let msgs: Vec<String> = serde_json::from_value(msgs).unwrap();
    assert_eq!(msgs[0], "TypeError: store() needs a string key");
    assert_eq!(msgs[1], "TypeError: load() needs a string key");
    assert_eq!(
        msgs[2],
        "TypeError: store(\"fn\"): the value cannot be turned into JSON"
    );
    assert!(msgs[3].starts_with("RangeError: store(\"big\"): the value is 307202 characters of JSON; one value may be at most 262144."), "{}", msgs[3]);
    assert!(
        msgs[4].starts_with("RangeError: store() is full"),
        "{}",
        msgs[4]
    );
    let mut s = script(
        r#"const v=load("obj"); v.a=2; const k={b:1}; store("kept",k); k.b=2; return [load("obj").a, load("kept").b]"#,
    );
    s.store.insert("obj".into(), json!({"a": 1}));
    assert_eq!(sandbox().run(s).await.value, Some(json!([1, 1])));
    let r = run(r#"store("a",1); throw new Error("boom")"#).await;
    assert!(!r.ok && r.store_writes.is_empty());
    healthy().await;
}

async fn images() {
    let r = run(r#"image("data:image/png;base64,iVBORw0KGgo="); image({image_url:"data:image/jpeg;base64,/9j/4A=="}); image({type:"image", data:"R0lGODlh", mimeType:"image/png"}); image("data:image/png;base64,UklGRgAAAABXRUJQ")"#).await;
    assert!(r.ok, "{:?}", r.error);
    let mimes: Vec<_> = r
        .output
        .iter()
        .map(|o| match o {
            OutputItem::Image { mime_type, .. } => mime_type.clone(),
            _ => String::new(),
        })
        .collect();
    assert_eq!(
        mimes,
        ["image/png", "image/jpeg", "image/gif", "image/webp"]
    );
    let msgs = value(r#"const out = [];
      for (const a of ["", "https://x/y.png", "data:image/png,raw", {type:"text"}, {type:"image",data:""}, 42,
                       "data:image/png;base64,AAAAA", "data:image/png;base64,QUJD"]) {
        try { image(a); out.push("no error") } catch (e) { out.push(e.name + ": " + e.message) }
      }
      return out"#).await;
    assert_eq!(
        msgs,
        json!([
            "TypeError: image() takes a base64 data URL, { image_url: dataUrl }, or an image block { type: \"image\", data, mimeType }",
            "TypeError: image() does not fetch remote URLs; pass the picture as a base64 data URL or an image block",
            "TypeError: image() got a string that is not a base64 data URL (data:<type>;base64,<data>)",
            "TypeError: image() takes blocks of type \"image\", not \"text\"",
            "TypeError: image() got an image block without data",
            "TypeError: image() takes a base64 data URL, { image_url: dataUrl }, or an image block { type: \"image\", data, mimeType }",
            "TypeError: image() data is not valid base64; it may be cut short or damaged",
            "TypeError: image() data is not a PNG, JPEG, GIF or WebP picture",
        ])
    );
    let r = run("image(\"data:image/png;base64,iVBORw0K\\r\\nGgo=\\n\")").await;
    assert_eq!(
        r.output,
        vec![OutputItem::Image {
            data: "iVBORw0KGgo=".into(),
            mime_type: "image/png".into()
        }]
    );
    let r = run("image(await tools.image_tool({}))").await;
    assert_eq!(
        r.output,
        vec![OutputItem::Image {
            data: PNG.into(),
            mime_type: "image/png".into()
        }]
    );
    healthy().await;
}

async fn lockdown_and_absent_capabilities() {
    let v = value("return [typeof process, typeof require, typeof setTimeout, typeof fetch, typeof WebAssembly, typeof std, typeof os, typeof structuredClone, typeof Intl, typeof Atomics, typeof WeakRef, typeof FinalizationRegistry]").await;
    assert!(
        v.as_array().unwrap().iter().all(|t| t == "undefined"),
        "{v}"
    );
    assert_eq!(
        value("try { await import('node:fs') } catch (e) { return e.name }").await,
        json!("ReferenceError")
    );
    assert_eq!(value("return [eval('typeof process'), new Function('return 1+1')(), tools.echo.constructor('return typeof require')()]").await, json!(["undefined", 2, "undefined"]));
    assert_eq!(
        value("Array.prototype.toJSON = () => 'x'; return JSON.stringify([1])").await,
        json!("[1]")
    );
    assert_eq!(value("try { Array.prototype.toString = () => 'x' } catch (e) { return e.message } return 'no error'").await, json!("Cannot assign to read only property 'toString' of a built-in"));
    assert_eq!(
        value("return (function(){ return this === undefined })()").await,
        json!(false)
    );
    assert_eq!(
        value("return Object.keys(globalThis)").await,
        json!([
            "store",
            "load",
            "tools",
            "ALL_TOOLS",
            "console",
            "text",
            "image",
            "textOf",
            "exit"
        ])
    );
    assert_eq!(
        value("const o = {}; o.toString = () => 'mine'; return String(o)").await,
        json!("mine")
    );
    healthy().await;
}

/// Every object a script can reach from the global object, or through values it can make (an
/// iterator, a generator, a promise), is frozen: nothing the bridge or another part of the script
/// relies on can be swapped out.
async fn every_reachable_intrinsic_is_frozen() {
    let v = value(r#"
        const hidden = {
          generatorFunction: Object.getPrototypeOf(function* () {}),
          asyncFunction: Object.getPrototypeOf(async function () {}),
          asyncGeneratorFunction: Object.getPrototypeOf(async function* () {}),
          generator: Object.getPrototypeOf(Object.getPrototypeOf((function* () {})())),
          asyncGenerator: Object.getPrototypeOf(Object.getPrototypeOf((async function* () {})())),
          arrayIterator: Object.getPrototypeOf([][Symbol.iterator]()),
          mapIterator: Object.getPrototypeOf(new Map().entries()),
          setIterator: Object.getPrototypeOf(new Set().values()),
          stringIterator: Object.getPrototypeOf(""[Symbol.iterator]()),
          regexpStringIterator: Object.getPrototypeOf(/a/g[Symbol.matchAll]("a")),
          typedArray: Object.getPrototypeOf(Int8Array),
          typedArrayIterator: Object.getPrototypeOf(new Uint8Array(1)[Symbol.iterator]()),
          promise: Object.getPrototypeOf(Promise.resolve()),
          throwTypeError: (Object.getOwnPropertyDescriptor(Function.prototype, "caller") || {}).get,
          iteratorHelper: typeof Iterator === "function" ? Object.getPrototypeOf([].values().map((x) => x)) : null,
          wrapForValidIterator: typeof Iterator === "function" && Iterator.from ? Object.getPrototypeOf(Iterator.from({ next() { return { done: true }; } })) : null,
          error: Object.getPrototypeOf(new TypeError("x")),
          functionPrototype: Function.prototype,
        };
        const seen = new Set();
        const stack = [[globalThis, "globalThis"]];
        for (const k of Object.keys(hidden)) if (hidden[k]) stack.push([hidden[k], "%" + k + "%"]);
        const notFrozen = [];
        while (stack.length) {
          const [o, path] = stack.pop();
          if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) continue;
          seen.add(o);
          if (o !== globalThis && !Object.isFrozen(o)) notFrozen.push(path);
          for (const k of Reflect.ownKeys(o)) {
            const d = Object.getOwnPropertyDescriptor(o, k);
            if (!d) continue;
            const name = path + "." + String(k);
            stack.push([d.value, name], [d.get, name + "<get>"], [d.set, name + "<set>"]);
          }
          stack.push([Object.getPrototypeOf(o), path + ".__proto__"]);
        }
        return [seen.size, notFrozen.slice(0, 20)];
    "#).await;
    assert!(
        v[0].as_u64().unwrap() > 1000,
        "walked only {} objects",
        v[0]
    );
    assert_eq!(v[1], json!([]), "not frozen");
}

/// Scripts that try to tamper with intrinsics, each in the way that would work if the object
/// were not frozen. None may change anything.
async fn tampering_with_intrinsics_changes_nothing() {
    let v = value(r#"
        const call = Function.prototype.call, apply = Function.prototype.apply, bind = Function.prototype.bind;
        const arrayIter = Object.getPrototypeOf([][Symbol.iterator]());
        const next = arrayIter.next;
        const attempts = [
          () => { Function.prototype.call = () => "pwned"; },
          () => { Function.prototype.apply = () => "pwned"; },
          () => { Function.prototype.bind = () => "pwned"; },
          () => Object.defineProperty(Function.prototype, "toString", { value: () => "pwned" }),
          () => { arrayIter.next = () => ({ done: true }); },
          () => Object.defineProperty(arrayIter, "next", { value: () => ({ done: true }) }),
          () => { Object.getPrototypeOf(arrayIter)[Symbol.iterator] = null; },
          () => { Object.getPrototypeOf(function* () {}).prototype.next = null; },
          () => { Object.getPrototypeOf(Int8Array).prototype.set = null; },
          () => { Object.getPrototypeOf(new Map().entries()).next = null; },
          () => { Object.getPrototypeOf(/a/g[Symbol.matchAll]("a")).next = null; },
          () => Object.defineProperty(Array.prototype.map, "name", { value: "pwned" }),
          () => { Array.prototype.map.extra = 1; if (Array.prototype.map.extra) throw new Error("extended"); },
          () => { delete Promise.prototype.then; },
          () => Object.setPrototypeOf(Array.prototype, null),
          () => { JSON.parse = null; },
          () => { Math.random = () => 4; },
          () => { globalThis.tools.echo.extra = 1; if (tools.echo.extra) throw new Error("extended"); },
          () => { text.call = null; },
          () => { console.log.apply = null; },
        ];
        const outcome = attempts.map((f) => { try { f(); return "ignored"; } catch (e) { return e.name; } });
        const intact = Function.prototype.call === call && Function.prototype.apply === apply
          && Function.prototype.bind === bind && arrayIter.next === next && Array.prototype.map.name === "map"
          && typeof Promise.prototype.then === "function" && JSON.parse("[1]")[0] === 1
          && [...[1, 2]].length === 2 && Math.random() !== 4 && Object.getPrototypeOf(Array.prototype) === Object.prototype;
        return [intact, outcome.filter((o) => o !== "ignored" && o !== "TypeError"), (await tools.echo({ ok: 1 })).ok];
    "#).await;
    assert_eq!(v, json!([true, [], 1]));
}

/// A lone surrogate in a store key is replaced like one in a value, never a sandbox failure.
async fn lone_surrogates_in_store_keys_are_replaced() {
    let r = run(
        r#"store("\ud800", 1); store("a\udc00b", "\ud800"); store("\ud83d\ude00", 2); return 1"#,
    )
    .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        r.store_writes,
        vec![
            StoreWrite::Set {
                key: "\u{fffd}".into(),
                value: json!(1)
            },
            StoreWrite::Set {
                key: "a\u{fffd}b".into(),
                value: json!("\u{fffd}")
            },
            StoreWrite::Set {
                key: "😀".into(),
                value: json!(2)
            },
        ]
    );
}

/// The store as `writes` leave it, applied in order as the host applies them.
fn applied(writes: &[StoreWrite]) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut store = std::collections::BTreeMap::new();
    for w in writes {
        match w {
            StoreWrite::Set { key, value } => {
                store.insert(key.clone(), value.clone());
            }
            StoreWrite::Delete { key, .. } => {
                store.remove(key);
            }
        }
    }
    store
}

/// Red team: a delete never checked its key, so three deletes of a 30-million-character key
/// crashed the worker (allocation failed outside the heap limit, 363 MB), and a delete refused
/// nothing a set would have refused.
async fn a_store_delete_checks_its_key_as_a_set_does() {
    let r = run(r#"const k="k".repeat(30000000); store(k,undefined); store(k,undefined); store(k,undefined); return "ok""#).await;
    let e = r
        .error
        .clone()
        .unwrap_or_else(|| panic!("the script succeeded, with {} writes", r.store_writes.len()));
    assert_eq!(
        (e.kind, e.name.as_deref()),
        (ErrorKind::Script, Some("RangeError")),
        "{e:?}"
    );
    assert!(
        e.message.contains("the key is more than 1024 bytes long"),
        "{e:?}"
    );
    assert!(e.message.len() < 400, "the key is not quoted whole");
    assert!(r.store_writes.is_empty());
    let msgs = value(
        r#"const out = [];
        for (const [k, v] of [["k".repeat(1025), undefined], ["k".repeat(1025), 1], ["é".repeat(513), undefined],
                              ["\ud800".repeat(342), 1], ["é".repeat(512), undefined], ["😀".repeat(256), 1]]) {
          try { store(k, v); out.push("no error") } catch (e) { out.push(e.name + ": " + e.message) }
        }
        return out"#,
    )
    .await;
    let msgs: Vec<String> = serde_json::from_value(msgs).unwrap();
    let refused = format!(
        "RangeError: store(\"{}…\"): the key is more than 1024 bytes long (UTF-8); a key may be at most 1024 bytes.",
        "k".repeat(40)
    );
    // A delete and a set of the same key fail alike; bytes are UTF-8 ones, a lone surrogate
    // three (the host keeps U+FFFD).
    assert!(msgs[0].starts_with(&refused), "{}", msgs[0]);
    assert_eq!(msgs[0], msgs[1]);
    assert!(msgs[2].contains("is more than 1024 bytes"), "{}", msgs[2]);
    assert!(msgs[3].contains("is more than 1024 bytes"), "{}", msgs[3]);
    assert_eq!(msgs[4..], ["no error", "no error"]);
    healthy().await;
}

/// Red team: each store() call added a write, even of a key written before, while only the
/// store as it ended was checked: 360 writes of one 262,000-character value crashed the worker,
/// and 300 made the host hold 285 MB. Only the last write of each key is sent now.
async fn store_writes_are_the_last_of_each_key() {
    let r =
        run(r#"const v="x".repeat(262000); for (let i=0;i<360;i++) store("k", v); return "ok""#)
            .await;
    assert_eq!(r.value, Some(json!("ok")), "{:?}", r.error);
    assert_eq!(r.store_writes.len(), 1);
    assert!(
        matches!(&r.store_writes[0], StoreWrite::Set { key, value } if key == "k" && value.as_str().map(str::len) == Some(262000))
    );

    // Applied in order, the writes leave the store as the script did.
    let r = run(
        r#"store("a",1); store("b",2); store("a",3); store("b",undefined); store("c",1); store("c",undefined); store("c",4); store("d",undefined);
        store("\ud800",1); store("\udc00",2); store("\ud800",3); return 1"#,
    )
    .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        r.store_writes.len(),
        6,
        "one write a key: {:?}",
        r.store_writes
    );
    assert_eq!(
        applied(&r.store_writes),
        [("a", json!(3)), ("c", json!(4)), ("\u{fffd}", json!(3))]
            .map(|(k, v)| (k.to_string(), v))
            .into()
    );
    // A delete of a key the store does not hold is kept (another script of the session may
    // have set it meanwhile).
    assert!(r.store_writes.contains(&StoreWrite::Delete {
        key: "d".into(),
        delete: true
    }));

    // Deletes have a bound too: keys the store does not hold, 1,001 characters each.
    let r = run(
        r#"let n = 0; try { for (let i = 0; i < 2000; i++) { store("x".repeat(997) + (1000 + i), undefined); n++ } } catch (e) { return [n, e.name, e.message] } return [n]"#,
    )
    .await;
    let v = r.value.clone().unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(v[0], json!(1047), "{v}");
    assert_eq!(v[1], "RangeError");
    assert!(
        v[2].as_str()
            .unwrap()
            .contains("the keys this script deleted come to more than 1048576 characters"),
        "{v}"
    );
    let sent: usize = r
        .store_writes
        .iter()
        .map(|w| match w {
            StoreWrite::Set { key, value } => key.len() + value.to_string().len(),
            StoreWrite::Delete { key, .. } => key.len(),
        })
        .sum();
    assert!(sent <= 1 << 20, "{sent} bytes of writes");
    healthy().await;
}

both_modes!(
    a_store_delete_checks_its_key_as_a_set_does,
    store_writes_are_the_last_of_each_key,
    lone_surrogates_in_store_keys_are_replaced,
    every_reachable_intrinsic_is_frozen,
    tampering_with_intrinsics_changes_nothing,
    values_text_and_console,
    tools_guard_and_identifiers,
    calls_errors_and_cancellation,
    host_globals_and_namespaces,
    exit_store_and_load,
    images,
    lockdown_and_absent_capabilities
);
