//! Stopping what confined programs leave running, and nothing else. Its own process, since
//! the list of confined programs is process-wide.

use std::process::{Command, Stdio};

#[test]
fn only_what_confined_programs_left_is_stopped_even_when_namespace_numbers_are_reused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "k").expect("key");
    if let Err(why) = codemode_childenv::confine_children([key], [dir.path().to_path_buf()]) {
        eprintln!("SKIPPED: confinement is unavailable here: {why}");
        return;
    }
    // Confined programs that end at once: their namespaces' numbers would be free for reuse.
    for _ in 0..10 {
        let mut cmd = Command::new("true");
        codemode_childenv::confine(&mut cmd).expect("confine");
        let mut child = cmd.spawn().expect("start");
        codemode_childenv::started_confined(child.id());
        child.wait().expect("wait");
    }
    // One that leaves a process behind.
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        "setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $!",
    ])
    .stdout(Stdio::piped());
    codemode_childenv::confine(&mut cmd).expect("confine");
    let child = cmd.spawn().expect("start");
    codemode_childenv::started_confined(child.id());
    let out = child.wait_with_output().expect("wait");
    let survivor: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a pid");
    // Programs of the same user in namespaces of their own that codemode did not start (a
    // browser's sandbox, another codemode): they may get the freed numbers, once the kernel
    // has freed them (it defers that).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut others: Vec<_> = (0..20)
        .map(|_| {
            Command::new("unshare")
                .args(["-U", "sleep", "600"])
                .spawn()
                .expect("unshare")
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));

    let stopped = codemode_childenv::stop_confined_survivors();

    let mut unrelated_alive = 0;
    for other in &mut others {
        if other.try_wait().expect("try_wait").is_none() {
            unrelated_alive += 1;
        }
        let _ = other.kill();
        let _ = other.wait();
    }
    assert_eq!(
        unrelated_alive, 20,
        "programs codemode did not start were killed"
    );
    assert_eq!(stopped, 1, "the one survivor, and only it");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let stat = std::fs::read_to_string(format!("/proc/{survivor}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "the survivor still runs: {stat}"
    );
}
