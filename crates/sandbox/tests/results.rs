//! Call results are built in the VM natively from their JSON text, not by `JSON.parse`. The
//! values must be exactly what `JSON.parse` makes of the same text, for odd but valid JSON too,
//! and text that is not JSON must still be refused.

mod common;

use std::sync::Arc;

use codemode_sandbox::*;
use common::*;
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::{Value, json};

/// `raw` answers with the JSON text it was given, as it is; `big` with 200,000 rows.
struct RawHost;

fn big_text() -> String {
    let rows: Vec<Value> = (0..200_000)
        .map(|i| json!({ "id": i, "name": format!("item-{i}") }))
        .collect();
    serde_json::to_string(&rows).unwrap()
}

impl Host for RawHost {
    fn call(&self, _call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        async { Err(HostError::new("only call_json")) }.boxed_local()
    }
    fn call_json(&self, call: HostCall) -> LocalBoxFuture<'static, Result<String, HostError>> {
        let text = match call.name.as_str() {
            "big" => big_text(),
            _ => call.args["text"].as_str().unwrap_or_default().to_string(),
        };
        async move { Ok(text) }.boxed_local()
    }
}

async fn run_raw(src: &str) -> ScriptResult {
    sandbox()
        .run(Script::new(src, Arc::new(RawHost)).with_tools([("raw", "")]))
        .await
}

/// Compares the built value with JSON.parse of the same text: same structure, same key order,
/// same numbers (-0 included), same own `__proto__` properties, same prototypes.
const COMPARE: &str = r#"
    function same(a, b) {
      if (typeof a !== typeof b) return false;
      if (typeof a === "number") return Object.is(a, b);
      if (a === null || typeof a !== "object") return a === b;
      if (Array.isArray(a) !== Array.isArray(b)) return false;
      if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
      const ka = Reflect.ownKeys(a), kb = Reflect.ownKeys(b);
      if (ka.length !== kb.length) return false;
      for (let i = 0; i < ka.length; i++) {
        if (ka[i] !== kb[i]) return false;
        const da = Object.getOwnPropertyDescriptor(a, ka[i]), db = Object.getOwnPropertyDescriptor(b, kb[i]);
        if (da.writable !== db.writable || da.enumerable !== db.enumerable || da.configurable !== db.configurable) return false;
        if (!same(da.value, db.value)) return false;
      }
      return true;
    }
    const out = [];
    for (const text of TEXTS) {
      let built, parsed, builtErr = null, parsedErr = null;
      try { built = await tools.raw({ text }); } catch (e) { builtErr = e.name; }
      try { parsed = JSON.parse(text); } catch (e) { parsedErr = e.name; }
      out.push(builtErr === null && parsedErr === null ? same(built, parsed) : [builtErr, parsedErr]);
    }
    return out;
"#;

async fn results_are_what_json_parse_makes_of_the_same_text() {
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let texts: Vec<String> = [
        r#"{"a":1,"b":[1,2,{"c":null}],"d":"x","e":true,"f":false}"#,
        "-0",
        "[-0, 0, -0.0, 1e-7, 5e-324, 2.2250738585072011e-308, 1.7976931348623157e308]",
        "[9007199254740993, 18446744073709551615, 18446744073709551616, -9223372036854775809, 123456789012345678901234567890]",
        "[0.1, 0.2, 0.30000000000000004, 1.0000000000000002, 3.141592653589793, 1e21, 1e-21]",
        "1e400",
        "-1e400",
        r#"{"__proto__": {"polluted": 1}, "constructor": 2}"#,
        r#"{"k": 1, "k": 2, "j": 3}"#,
        r#"{"2": "b", "1": "a", "x": "c", "0": "z"}"#,
        r#""\ud800 lone, \udc00 low, \ud83d\ude00 pair""#,
        r#""é \u00e9 \n \t \" \\ \/ 日本 😀""#,
        r#"{"":"empty key", " ": "space"}"#,
        "[]",
        "{}",
        "  [1 , 2 ]  ",
        &deep,
        "null",
        "\"\"",
        // Not JSON: both must refuse.
        "[1,]",
        "{'a':1}",
        "NaN",
        "[1] x",
        "",
        "\"\\x41\"",
        "01",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let src = format!("const TEXTS = {};\n{COMPARE}", json!(texts));
    let r = run_raw(&src).await;
    assert!(r.ok, "{:?}", r.error);
    let got = r.value.unwrap();
    for (i, (text, v)) in texts.iter().zip(got.as_array().unwrap()).enumerate() {
        // Both build the same value, or both refuse the text (the bridge says so as a TypeError).
        let agree = v == &json!(true)
            || v.as_array().is_some_and(|pair| {
                pair[0] == json!("TypeError") && pair[1] == json!("SyntaxError")
            });
        assert!(agree, "text {i} {text:?}: {v}");
    }
}

async fn a_result_larger_than_the_heap_is_a_clear_error() {
    let sb = cached("small-heap", || SandboxConfig {
        defaults: Limits {
            heap_bytes: 4 << 20,
            ..Limits::default()
        },
        ..Default::default()
    });
    let r = sb
        .run(
            Script::new(
                "let r; try { r = await tools.big(); } catch (e) { return [e.name, e.message]; } return r.length",
                Arc::new(RawHost),
            )
            .with_tools([("big", "")]),
        )
        .await;
    // The script catches the failed call: the VM is still usable after the failed build.
    let v = r.value.expect("the script catches the error");
    assert_eq!(v[0], json!("RangeError"), "{v}");
    assert!(
        v[1].as_str()
            .unwrap()
            .contains("does not fit in the script's heap limit"),
        "{v}"
    );
}

both_modes!(
    results_are_what_json_parse_makes_of_the_same_text,
    a_result_larger_than_the_heap_is_a_clear_error,
);
