//! Workers that break the bridge on purpose. This test binary is its own worker: started with
//! `--misbehave HOW` before the worker marker, it sets itself up exactly like the real worker
//! (all isolation layers included) and then does HOW when a script arrives. Each case checks
//! that only that script fails, with a clear message, and that the host carries on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_sandbox::testing::{MARKER, TestWorker};
use codemode_sandbox::*;
use futures::future::LocalBoxFuture;
use serde_json::Value;

struct Echo;
impl Host for Echo {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        Box::pin(async move { Ok(call.args) })
    }
}

fn misbehave(how: &str, worker_args: &[String]) -> ! {
    let mut w = TestWorker::prepare(worker_args);
    w.wait_for_start();
    match how {
        // A frame with a tag no version of the protocol has.
        "garbage" => w.send_raw(&[9, 0, 0, 0, 0xee, 1, 2, 3, 4, 5, 6, 7, 8]),
        // A header announcing a 1 GiB message, then the first bytes of it.
        "huge" => {
            let mut b = (1u32 << 30).to_le_bytes().to_vec();
            b.extend_from_slice(&[2; 4096]);
            w.send_raw(&b)
        }
        // A well-formed call of a tool the script was not given.
        "stranger" => w.send_call(1, "rm_everything", "{}"),
        // Call ids must count up from 1.
        "skip" => w.send_call(7, "echo", "{}"),
        // A system call outside the allow-list: seccomp kills the process.
        "syscall" => unsafe {
            libc::openat(libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY);
        },
        // Invalid UTF-8 inside a well-framed call.
        "utf8" => w.send_raw(&[
            21, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xfe, 0, 0, 0, 0,
        ]),
        other => panic!("unknown misbehaviour {other}"),
    }
    // Then hang, ignoring the stop flag, as an engine stuck in native code would.
    loop {
        std::hint::spin_loop();
    }
}

fn sandbox_with(how: &str) -> Sandbox {
    let exe = std::env::current_exe().unwrap();
    Sandbox::new(SandboxConfig {
        worker_program: Some(WorkerProgram {
            path: exe,
            args: vec!["--misbehave".into(), how.into()],
        }),
        warm: 1,
        defaults: Limits {
            timeout_ms: 20_000,
            ..Limits::default()
        },
        ..Default::default()
    })
    .unwrap()
}

fn script() -> Script {
    Script::new("return await tools.echo({ a: 1 })", Arc::new(Echo)).with_tools([("echo", "")])
}

async fn case(how: &str, expect: &[&str]) -> Result<(), String> {
    let sb = sandbox_with(how);
    let t = Instant::now();
    let r = sb.run(script()).await;
    let e = r
        .error
        .ok_or_else(|| format!("{how}: the script succeeded"))?;
    if e.kind != ErrorKind::Sandbox {
        return Err(format!("{how}: error kind {:?}: {}", e.kind, e.message));
    }
    for want in expect {
        if !e.message.contains(want) {
            return Err(format!("{how}: {:?} does not say {want:?}", e.message));
        }
    }
    // The bad worker was stopped at once, not at the 20 s deadline.
    if t.elapsed() > Duration::from_secs(10) {
        return Err(format!("{how}: took {:?}", t.elapsed()));
    }
    // Its pool replaced it: the next script gets a fresh (equally bad) worker, and fails the
    // same way instead of hanging on a dead one.
    let again = sb.run(script()).await;
    if again.ok {
        return Err(format!("{how}: the second script succeeded"));
    }
    Ok(())
}

async fn all_cases() -> Vec<String> {
    let mut failures = Vec::new();
    for (how, expect) in [
        (
            "garbage",
            &["broke the bridge protocol", "unknown message tag"][..],
        ),
        (
            "huge",
            &["broke the bridge protocol", "1073741824 bytes"][..],
        ),
        ("stranger", &["broke the bridge protocol", "not given"][..]),
        ("skip", &["broke the bridge protocol", "count up"][..]),
        ("utf8", &["broke the bridge protocol", "UTF-8"][..]),
        ("syscall", &["crashed", "seccomp"][..]),
    ] {
        match case(how, expect).await {
            Ok(()) => println!("test bad_worker::{how} ... ok"),
            Err(e) => {
                println!("test bad_worker::{how} ... FAILED: {e}");
                failures.push(e);
            }
        }
    }
    // The host is unharmed: a sandbox with the real worker still runs scripts.
    let good = Sandbox::new(SandboxConfig::default()).unwrap();
    let r = good.run(script()).await;
    if r.value != Some(serde_json::json!({ "a": 1 })) {
        failures.push(format!(
            "a good worker after the bad ones failed: {:?}",
            r.error
        ));
    } else {
        println!("test bad_worker::host_carries_on ... ok");
    }
    failures
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == MARKER) {
        let how = args
            .iter()
            .position(|a| a == "--misbehave")
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_default();
        misbehave(&how, &args[at + 1..]);
    }
    // `cargo test` passes filters and flags; this file always runs its few cases.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let failures = rt.block_on(all_cases());
    let passed = 7 - failures.len();
    println!(
        "\ntest result: {}. {passed} passed; {} failed",
        if failures.is_empty() { "ok" } else { "FAILED" },
        failures.len()
    );
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
