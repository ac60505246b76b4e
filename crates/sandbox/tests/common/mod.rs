#![allow(dead_code)]
//! Test hosts: echo, fail, slow-until-cancelled, rows, and helpers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use codemode_sandbox::*;
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::{Value, json};

#[derive(Default)]
pub struct TestHost {
    pub calls: Mutex<Vec<(String, Value)>>,
    pub cancelled: Arc<AtomicUsize>,
}

impl Host for TestHost {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        // A test that failed while holding the lock must not fail every later call.
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((call.name.clone(), call.args.clone()));
        let cancelled = self.cancelled.clone();
        async move {
            match call.name.as_str() {
                "echo" | "my-tool" | "my_tool" => Ok(call.args),
                "fail" => Err(HostError::new("tool exploded")),
                "fail_props" => {
                    let mut e = HostError::new("nope");
                    e.name = Some("ToolError".into());
                    e.properties.insert("code".into(), json!(7));
                    Err(e)
                }
                "slow" => {
                    call.cancel.cancelled().await;
                    cancelled.fetch_add(1, Ordering::SeqCst);
                    Err(HostError::new("cancelled"))
                }
                "sleep" => {
                    let ms = call.args.get("ms").and_then(Value::as_u64).unwrap_or(10);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(call.args)
                }
                "rows" => Ok(rows()),
                "image_tool" => Ok(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
                "searchTools" | "models.classify" => {
                    Ok(json!({"global": call.name, "args": call.args}))
                }
                other => Err(HostError::new(format!("no tool {other}"))),
            }
        }
        .boxed_local()
    }
}

pub const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

pub fn rows() -> Value {
    Value::Array(
        (0..20000)
            .map(|i| {
                json!({"id": i, "name": format!("item-{i}"), "tags": ["a", "b", if i % 7 == 0 { "seven" } else { "other" }], "score": (i * 37) % 101})
            })
            .collect(),
    )
}

pub fn host() -> Arc<TestHost> {
    static HOST: OnceLock<Arc<TestHost>> = OnceLock::new();
    HOST.get_or_init(|| Arc::new(TestHost::default())).clone()
}

thread_local! {
    static MODE: std::cell::Cell<Isolation> = const { std::cell::Cell::new(Isolation::Process) };
}

/// The isolation the current test runs under (see `both_modes!`).
pub fn mode() -> Isolation {
    MODE.with(|m| m.get())
}

pub fn set_mode(m: Isolation) {
    MODE.with(|c| c.set(m));
}

/// One sandbox per configuration name and isolation mode, shared by the tests of a file.
pub fn cached(name: &'static str, config: impl FnOnce() -> SandboxConfig) -> Sandbox {
    static ALL: OnceLock<Mutex<std::collections::HashMap<(&'static str, bool), Sandbox>>> =
        OnceLock::new();
    let mode = mode();
    let mut all = ALL.get_or_init(Default::default).lock().unwrap();
    all.entry((name, mode == Isolation::Process))
        .or_insert_with(|| {
            Sandbox::new(SandboxConfig {
                isolation: mode,
                ..config()
            })
            .unwrap()
        })
        .clone()
}

pub fn sandbox() -> Sandbox {
    cached("default", || SandboxConfig {
        warm: 2,
        ..Default::default()
    })
}

/// Runs each named `async fn` as two tests: `process_isolation::NAME` and `thread_isolation::NAME`.
/// `multi:` before the names runs them on a multi-threaded runtime.
#[macro_export]
macro_rules! both_modes {
    (multi: $($name:ident),* $(,)?) => {
        $crate::both_modes!(@emit process_isolation_mt, Process, (flavor = "multi_thread", worker_threads = 2), $($name),*);
        $crate::both_modes!(@emit thread_isolation_mt, Thread, (flavor = "multi_thread", worker_threads = 2), $($name),*);
    };
    ($($name:ident),* $(,)?) => {
        $crate::both_modes!(@emit process_isolation, Process, (), $($name),*);
        $crate::both_modes!(@emit thread_isolation, Thread, (), $($name),*);
    };
    (@emit $module:ident, $mode:ident, $flavor:tt, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test $flavor]
                async fn $name() {
                    $crate::common::set_mode(codemode_sandbox::Isolation::$mode);
                    super::$name().await
                }
            )*
        }
    };
}

pub const TOOLS: &[(&str, &str)] = &[
    ("echo", "Return the arguments"),
    ("fail", "Always fails"),
    ("slow", "Waits until cancelled"),
    ("rows", "20,000 rows"),
    ("sleep", "Sleeps"),
    ("fail_props", "Fails with properties"),
    ("image_tool", "Returns an image block"),
];

pub fn script(src: &str) -> Script {
    Script::new(src, host()).with_tools(TOOLS.iter().copied())
}

pub async fn run(src: &str) -> ScriptResult {
    sandbox().run(script(src)).await
}

pub async fn value(src: &str) -> Value {
    let r = run(src).await;
    assert!(r.ok, "script failed: {:?}", r.error);
    r.value.unwrap_or(Value::Null)
}

pub async fn error(src: &str) -> ScriptError {
    let r = run(src).await;
    assert!(!r.ok, "script succeeded: {:?}", r.value);
    r.error.unwrap()
}

/// The sandbox still works after something hostile.
pub async fn healthy() {
    assert_eq!(
        value("return (await tools.echo({ x: 41 })).x + 1").await,
        json!(42)
    );
}

pub fn texts(r: &ScriptResult) -> Vec<String> {
    r.output
        .iter()
        .filter_map(|o| match o {
            OutputItem::Text { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// A finished script's result holding only `items` as its output, for rendering tests.
pub fn result_with_output(items: Vec<OutputItem>) -> ScriptResult {
    ScriptResult {
        ok: true,
        value: None,
        output: items,
        calls: vec![],
        store_writes: vec![],
        error: None,
        wall_ms: 0.0,
        options: Default::default(),
        limits: Default::default(),
    }
}

/// Holds every call until released, counting the calls it holds.
#[derive(Default)]
pub struct HoldingHost {
    pub holding: AtomicUsize,
    pub released: Arc<AtomicBool>,
}

impl Host for HoldingHost {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        self.holding.fetch_add(1, Ordering::SeqCst);
        let released = self.released.clone();
        async move {
            while !released.load(Ordering::SeqCst) && !call.cancel.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(json!("released"))
        }
        .boxed_local()
    }
}
