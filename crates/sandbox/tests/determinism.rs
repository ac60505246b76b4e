mod common;
use codemode_sandbox::*;
use common::*;
use serde_json::json;

fn det(src: &str, seed: u32) -> Script {
    let mut s = script(src);
    s.determinism = Some(Determinism {
        seed,
        start_ms: 1_000_000.0,
    });
    s
}

async fn seeded_random_virtual_clock_and_utc() {
    let src = "return [Math.random(), Math.random(), Date.now(), new Date().getTime(), performance.now(), new Date(0).getTimezoneOffset(), new Date(0).getHours(), typeof WeakRef, new Date() instanceof Date]";
    let a = sandbox().run(det(src, 42)).await.value.unwrap();
    let b = sandbox().run(det(src, 42)).await.value.unwrap();
    let c = sandbox().run(det(src, 43)).await.value.unwrap();
    assert_eq!(a, b);
    assert_ne!(a[0], c[0]);
    assert_eq!(
        &a.as_array().unwrap()[2..],
        &[
            json!(1_000_000),
            json!(1_000_000),
            json!(0),
            json!(0),
            json!(0),
            json!("undefined"),
            json!(true)
        ]
    );
    let v = sandbox().run(det("return [String(new Date(0)), new Date(0).toDateString(), new Date(2020, 0, 2, 3).getTime() === Date.UTC(2020, 0, 2, 3), new Date(86400000).getDate()]", 1)).await.value.unwrap();
    assert_eq!(
        v,
        json!([
            "Thu Jan 01 1970 00:00:00 GMT+0000 (Coordinated Universal Time)",
            "Thu Jan 01 1970",
            true,
            2
        ])
    );
    // Time moves only when a result is delivered, never backwards.
    let v = sandbox().run(det("const a = Date.now(); for (let i = 0; i < 1e6; i++); const b = Date.now(); await tools.sleep({ms: 30}); const c = Date.now(); return [a, b, c]", 1)).await.value.unwrap();
    assert_eq!(v[0], v[1]);
    assert!(v[2].as_f64().unwrap() >= 1_000_030.0, "{v}");
    let mut bad = det("return 1", 1);
    bad.determinism = Some(Determinism {
        seed: 1,
        start_ms: f64::NAN,
    });
    assert_eq!(
        sandbox().run(bad).await.error.unwrap().kind,
        ErrorKind::Sandbox
    );
    // Without determinism the clock is real.
    let v = value("return Date.now() > 1.7e12").await;
    assert_eq!(v, json!(true));
}

async fn results_are_delivered_in_call_order() {
    let src = "const order = []; await Promise.all([tools.sleep({ms: 80}).then(() => order.push(1)), tools.sleep({ms: 1}).then(() => order.push(2)), tools.echo(3).then(() => order.push(3))]); return order";
    assert_eq!(
        sandbox().run(det(src, 7)).await.value,
        Some(json!([1, 2, 3]))
    );
}

async fn record_then_replay_without_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.jsonl");
    // A marker of this run only: the other isolation mode runs this test at the same time.
    let marker = dir.path().display().to_string();
    let src = &format!(
        r#"const a = await tools.echo({{ r: Math.random(), marker: {marker:?} }});
        const [x, y] = await Promise.all([tools.sleep({{ms: 5}}), tools.echo("y")]);
        let err; try {{ await tools.fail_props() }} catch (e) {{ err = [e.name, e.message, e.code] }}
        text("t " + Date.now());
        return {{ a, x, y, err, now: Date.now() }}"#
    );
    let mut s = det(src, 9);
    s.record = Some(log.clone());
    let first = sandbox().run(s).await;
    assert!(first.ok, "{:?}", first.error);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines[0]["seed"], 9);
    assert_eq!(lines.iter().filter(|l| l["type"] == "call").count(), 4);
    assert_eq!(lines.iter().filter(|l| l["type"] == "result").count(), 4);

    // Replay must not reach the host. Other tests share it and run in parallel, so count only
    // this script's own marked call.
    let marked = || {
        host()
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, args)| args["marker"] == marker.as_str())
            .count()
    };
    let calls_before = marked();
    let mut s = script(src);
    s.replay = Some(log.clone());
    let second = sandbox().run(s).await;
    assert!(second.ok, "{:?}", second.error);
    assert_eq!(marked(), calls_before, "replay must not touch the host");
    assert_eq!(second.value, first.value);
    assert_eq!(second.output, first.output);

    // Another script may follow the log until its first different call, which names the step.
    let mut s = script("await tools.fail({ other: true }); return 1");
    s.replay = Some(log.clone());
    let e = sandbox().run(s).await.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Sandbox);
    assert!(e.message.contains("call 1"), "{}", e.message);
    let mut lines = std::fs::read_to_string(&log).unwrap();
    lines = lines.replacen(
        "\"name\":\"echo\",\"kind\":\"tool\",\"args\":\"y\"",
        "\"name\":\"echo\",\"kind\":\"tool\",\"args\":\"z\"",
        1,
    );
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, lines).unwrap();
    let mut s = script(src);
    s.replay = Some(bad);
    let e = sandbox().run(s).await.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Sandbox);
    assert!(
        e.message.contains("call 3")
            && e.message.contains("echo(\"y\")")
            && e.message.contains("echo(\"z\")"),
        "{}",
        e.message
    );
    healthy().await;
}

/// Red team: `Object.getPrototypeOf(Date)` was the real `Date`, whose clock ignored the virtual
/// one, so a replay could take another branch or return another value; and in a worker, the
/// first local-time conversion (`new Date().toString()`) opened /etc/localtime and was killed by
/// seccomp. Neither the real clock nor a crash is within a script's reach.
async fn the_real_clock_is_out_of_reach_and_local_time_works() {
    let src = "const D = Object.getPrototypeOf(Date); return [D === Function.prototype, typeof D.now, Date.now(), new Date(0).toString(), new Date(2020, 0, 1).getTime(), Date.parse('2020-01-01T00:00'), Date.UTC(2020, 0, 1), new Date().toLocaleString().length > 0]";
    let v = sandbox().run(det(src, 7)).await.value.unwrap();
    assert_eq!(
        v,
        json!([
            true,
            "undefined",
            1_000_000,
            "Thu Jan 01 1970 00:00:00 GMT+0000 (Coordinated Universal Time)",
            1_577_836_800_000u64,
            1_577_836_800_000u64,
            1_577_836_800_000u64,
            true
        ])
    );
    // Without determinism too: every local-time reading works in a worker.
    let v = value("return [new Date(0).toString().length > 0, new Date(2020, 0, 1).getTimezoneOffset(), new Date().toLocaleString().length > 0, new Date('2020-01-01T00:00:00').getTime() > 0]").await;
    assert_eq!(v[0], json!(true), "{v}");
    assert_eq!(v[2], json!(true), "{v}");
    assert_eq!(v[3], json!(true), "{v}");
    healthy().await;
}

both_modes!(
    the_real_clock_is_out_of_reach_and_local_time_works,
    seeded_random_virtual_clock_and_utc,
    results_are_delivered_in_call_order,
    record_then_replay_without_the_host
);
