//! What only process isolation can promise: limits that hold inside native code, crashes that
//! stay in their worker, and layers the host can name.
mod common;
use std::time::{Duration, Instant};

use codemode_sandbox::*;
use common::*;
use serde_json::json;

/// Native built-ins that QuickJS's interrupt handler never sees running: each would take hours.
const NATIVE_OVERRUNS: &[(&str, &str)] = &[
    (
        "indexOf",
        "const h = 'a'.repeat(1 << 22), n = 'a'.repeat(1 << 21) + 'b'; return h.indexOf(n)",
    ),
    (
        "includes",
        "const h = 'a'.repeat(1 << 22), n = 'a'.repeat(1 << 21) + 'b'; return h.includes(n)",
    ),
    (
        "split",
        "const h = 'a'.repeat(1 << 22), n = 'a'.repeat(1 << 21) + 'b'; return h.split(n).length",
    ),
    (
        "replaceAll",
        "const h = 'a'.repeat(1 << 22), n = 'a'.repeat(1 << 21) + 'b'; return h.replaceAll(n, '').length",
    ),
    (
        "BigInt toString",
        "return (7n ** 200000n).toString().length",
    ),
];

#[tokio::test]
async fn native_code_cannot_outrun_the_deadline() {
    set_mode(Isolation::Process);
    let sb = sandbox();
    let runs = NATIVE_OVERRUNS.iter().map(|(name, src)| {
        let sb = sb.clone();
        async move {
            let t = Instant::now();
            let r = sb
                .run(script(&format!(
                    "// @options: {{\"timeout_ms\": 1000}}\n{src}"
                )))
                .await;
            (name, r, t.elapsed())
        }
    });
    for (name, r, took) in futures::future::join_all(runs).await {
        let e = r
            .error
            .unwrap_or_else(|| panic!("{name} finished: {:?}", r.value));
        assert_eq!(e.kind, ErrorKind::Timeout, "{name}: {e:?}");
        // The same clear message as a script the interrupt handler stopped.
        assert_eq!(e.message, "Execution timed out after 1000 ms", "{name}");
        // Deadline plus the kill grace, with room for a loaded machine.
        assert!(took < Duration::from_millis(4000), "{name} took {took:?}");
    }
    healthy().await;
}

#[tokio::test]
async fn native_code_cannot_outrun_the_cpu_budget() {
    set_mode(Isolation::Process);
    let sb = cached("cpu", || SandboxConfig {
        defaults: Limits {
            cpu_ms: 1000,
            ..Limits::default()
        },
        warm: 1,
        ..Default::default()
    });
    let t = Instant::now();
    let r = sb.run(script(NATIVE_OVERRUNS[0].1)).await;
    let e = r.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e:?}");
    assert!(e.message.contains("CPU budget of 1000 ms"), "{}", e.message);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_worker_killed_mid_call_fails_only_its_script() {
    set_mode(Isolation::Process);
    let sb = cached("kill", || SandboxConfig {
        warm: 1,
        ..Default::default()
    });
    let before = host().cancelled.load(std::sync::atomic::Ordering::SeqCst);
    let handle = tokio::spawn(sb.run(script("text('started'); await tools.slow(); return 1")));
    // Wait until the call is out, then kill every worker of this sandbox from outside.
    let t = Instant::now();
    while host()
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.0 == "slow")
        .count()
        == 0
        && t.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Idle workers die too: the pool must notice before it hands them a script.
    for pid in sb.worker_pids() {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let r = handle.await.unwrap();
    let e = r.error.clone().unwrap();
    assert_eq!(e.kind, ErrorKind::Sandbox);
    assert!(
        e.message.contains("crashed") && e.message.contains("killed"),
        "{}",
        e.message
    );
    // What it did before it died is kept: its output and its call, now cancelled.
    assert_eq!(texts(&r), ["started"]);
    assert_eq!(r.calls[0].status, CallStatus::Cancelled);
    for _ in 0..200 {
        if host().cancelled.load(std::sync::atomic::Ordering::SeqCst) > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(host().cancelled.load(std::sync::atomic::Ordering::SeqCst) > before);
    // The pool replaced the worker.
    let r = sb.run(script("return 2")).await;
    assert_eq!(r.value, Some(json!(2)), "{:?}", r.error);
}

#[tokio::test]
async fn allocating_past_the_process_limit_fails_the_script_not_the_host() {
    set_mode(Isolation::Process);
    // The heap limit is above what the process may hold, so the kernel's limit is hit first.
    let sb = cached("rlimit", || SandboxConfig {
        defaults: Limits {
            heap_bytes: 1 << 30,
            ..Limits::default()
        },
        worker_memory_bytes: Some(192 << 20),
        warm: 1,
        ..Default::default()
    });
    for src in [
        "const a = []; while (true) a.push('x'.repeat(1 << 20) + a.length)",
        "const a = []; while (true) a.push(new Array(1e6).fill(a.length))",
    ] {
        let r = sb.run(script(src)).await;
        let e = r.error.unwrap();
        assert!(
            e.message.contains("out of memory") || e.message.contains("crashed"),
            "{src}: {e:?}"
        );
    }
    assert_eq!(sb.run(script("return 3")).await.value, Some(json!(3)));
}

#[tokio::test]
async fn every_isolation_layer_is_reported_and_active_here() {
    set_mode(Isolation::Process);
    let layers = sandbox().isolation_layers().unwrap().to_vec();
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    for want in [
        "descriptors",
        "session",
        "environment",
        "rlimits",
        "no_new_privs",
        "landlock",
        "seccomp",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // This project's machines (Linux 6.x) have every feature; elsewhere the list says what is missing.
    for l in &layers {
        assert!(l.active, "{} is not active: {}", l.name, l.detail);
    }
    let thread = Sandbox::new(SandboxConfig {
        isolation: Isolation::Thread,
        ..Default::default()
    })
    .unwrap();
    assert!(thread.isolation_layers().is_none());
}

#[tokio::test]
async fn the_worker_cannot_reach_files_or_processes() {
    set_mode(Isolation::Process);
    // What a script can try without an engine bug: nothing of the kind exists in the VM.
    let v = value("return [typeof require, typeof process, typeof std, typeof os, typeof fetch, typeof WebAssembly]").await;
    assert!(
        v.as_array().unwrap().iter().all(|t| t == "undefined"),
        "{v}"
    );
    // Each worker process has its own process group and no environment.
    for pid in sandbox().worker_pids() {
        let pgid = unsafe { libc::getpgid(pid) };
        assert_eq!(pgid, pid, "worker {pid} is not its own group leader");
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(env.is_empty(), "worker {pid} has an environment");
    }
}

#[tokio::test]
async fn options_cannot_raise_the_operators_limits_end_to_end() {
    for mode in [Isolation::Process, Isolation::Thread] {
        set_mode(mode);
        let sb = cached("low", || SandboxConfig {
            defaults: Limits {
                timeout_ms: 3_000,
                max_output_tokens: 100,
                ..Limits::default()
            },
            warm: 1,
            ..Default::default()
        });
        let r = sb
            .run(script(
                "\u{feff}// @options: {\"timeout_ms\": 3600000, \"max_output_tokens\": 1000000}\nreturn 1",
            ))
            .await;
        assert_eq!(
            (r.limits.timeout_ms, r.limits.max_output_tokens),
            (3_000, 100)
        );
        let t = Instant::now();
        let r = sb
            .run(script(
                "// @options: {\"timeout_ms\": 3600000}\nwhile (true) {}",
            ))
            .await;
        assert_eq!(
            r.error.unwrap().message,
            "Execution timed out after 3000 ms"
        );
        assert!(t.elapsed() < Duration::from_secs(20));
    }
}
