mod common;
use common::*;
use serde_json::json;

async fn returns_values_and_calls_tools() {
    assert_eq!(value("return 1").await, json!(1));
    assert_eq!(
        value("return { a: 1, b: [true, 'x'] }").await,
        json!({"a": 1, "b": [true, "x"]})
    );
    let r = run("").await;
    assert!(!r.ok);
    let r = run("return undefined").await;
    assert!(r.ok && r.value.is_none());
    assert_eq!(
        value("return await tools.echo({ i: 3 })").await,
        json!({"i": 3})
    );
    assert_eq!(
        value(
            "let s = 0; for (let i = 0; i < 100; i++) s += (await tools.echo({ i })).i; return s"
        )
        .await,
        json!(4950)
    );
    healthy().await;
}

/// Most answers are immediate, and in thread isolation the script takes them in place, in the
/// middle of its turn; an answer that is not (here a sleeping call) still arrives between them,
/// and every call is recorded.
/// Arguments that are not plain data go through JSON.stringify, with its verdict.
async fn answers_taken_in_place_and_arguments_of_every_shape() {
    let r = run(r#"const slow = tools.sleep({ ms: 30 });
        let s = 0;
        for (let i = 0; i < 300; i++) s += (await tools.echo({ i })).i;
        const early = await slow;
        let t = 0;
        for (let i = 0; i < 50; i++) t += (await tools.echo({ i })).i;
        return [s, early.ms, t]"#)
    .await;
    assert_eq!(r.value, Some(json!([44850, 30, 1225])), "{:?}", r.error);
    assert_eq!(r.calls.len(), 351);
    assert!(
        r.calls
            .iter()
            .all(|c| c.status == codemode_sandbox::CallStatus::Ok)
    );
    assert_eq!(
        value(r#"const cyclic = {}; cyclic.self = cyclic;
            const out = [];
            out.push(await tools.echo({ get a() { return 1; } }));
            out.push(await tools.echo({ toJSON() { return "custom"; } }));
            out.push(await tools.echo({ when: new Date(0), list: [1, , undefined, () => 1] }));
            out.push(await tools.echo(new Proxy({ p: 1 }, {})));
            out.push(await tools.echo({ text: "line\n\"quoted\" \u0001 é", n: -0, f: 0.5, big: 1e21 }));
            try { await tools.echo({ cyclic }); } catch (e) { out.push(e.name); }
            try { await tools.echo({ n: 1n }); } catch (e) { out.push(e.name); }
            return out"#)
        .await,
        json!([
            {"a": 1},
            "custom",
            {"when": "1970-01-01T00:00:00.000Z", "list": [1, null, null, null]},
            {"p": 1},
            {"text": "line\n\"quoted\" \u{1} é", "n": 0, "f": 0.5, "big": 1e21},
            "TypeError",
            "TypeError"
        ])
    );
    healthy().await;
}

/// A call waits in place for its answer only when it is the first of its job (process
/// isolation; thread isolation takes answers in place anyway). Attacks on that: a result of an
/// earlier call that arrives while a later call waits (it must be kept, in order, not lost or
/// taken for the awaited one), an answer that is an error (it rejects the usual way), a burst of
/// calls made in one job (each gets its own answer), and a call answered late that the waiting
/// call must not block on.
async fn calls_waiting_in_place_keep_other_results() {
    let r = run(r#"const slow = tools.sleep({ ms: 5 });
        // Keep the VM busy, without awaiting, until the slow answer has surely come.
        const until = Date.now() + 60;
        let spins = 0;
        while (Date.now() < until) spins++;
        await null;
        const fast = await tools.echo({ i: 7 });
        const early = await slow;
        let failed = null;
        try { await tools.fail({}); } catch (e) { failed = e.message; }
        const burst = await Promise.all([1, 2, 3, 4, 5].map((i) => tools.echo({ i })));
        const late = tools.sleep({ ms: 20 });
        const after = await tools.echo({ i: 8 });
        return [fast.i, early.ms, failed, burst.map((b) => b.i), after.i, (await late).ms]"#)
    .await;
    assert_eq!(
        r.value,
        Some(json!([7, 5, "tool exploded", [1, 2, 3, 4, 5], 8, 20])),
        "{:?}",
        r.error
    );
    let ids: Vec<u64> = r.calls.iter().map(|c| c.id).collect();
    assert_eq!(ids, (1..=10).collect::<Vec<u64>>());
    healthy().await;
}

both_modes!(
    returns_values_and_calls_tools,
    answers_taken_in_place_and_arguments_of_every_shape,
    calls_waiting_in_place_keep_other_results
);
