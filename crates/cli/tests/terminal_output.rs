//! What a script returns (a file it read, a tool's result) reaches a person's terminal only as
//! text: at a terminal, `codemode run` shows escape sequences, C1 controls and bidirectional
//! overrides escaped, so a hostile file cannot write the clipboard (OSC 52), hide lines or
//! reorder what is shown. Piped, the output stays byte for byte what the script returned.
//! `script(1)` gives the command a real pseudo-terminal.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common;

/// A value with an OSC 52 clipboard write, a line erase, a carriage return that overwrites, a
/// C1 CSI, DEL and a right-to-left override.
const HOSTILE: &str = "A\u{1b}]52;c;aGk=\u{7}B\u{1b}[2KC\rD\u{9b}31mE\u{7f}F\u{202e}G";

const SCRIPT: &str =
    r#"return "first line\n" + "A\u001b]52;c;aGk=\u0007B\u001b[2KC\rD\u009b31mE\u007fF\u202eG""#;

/// Characters a terminal acts on (or that reorder its text), other than newline and tab.
fn acting(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| {
            (c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// Runs `codemode run <extra> s.js` at a pseudo-terminal; returns what the terminal received.
fn at_terminal(extra: &str, script: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.js");
    std::fs::write(&file, script).unwrap();
    let d = dir.path().display();
    at_terminal_in(
        dir.path(),
        &format!(
            "run {extra} --config-dir {d} --workdir {d} {}",
            file.display()
        ),
    )
}

/// Runs `codemode <args>` at a pseudo-terminal, its state in `dir`; returns what the terminal
/// received, standard output and error together.
fn at_terminal_in(dir: &std::path::Path, args: &str) -> String {
    let command = format!("{} {args}", common::bin().display());
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("XDG_STATE_HOME", dir.join("state"))
        .env_remove("CODEMODE_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("script(1) from util-linux runs");
    // The terminal turns each "\n" into "\r\n"; a "\r" of the script's own would stay alone.
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}

/// `codemode policy check` quotes a project's policy file (an unknown tool's name, an unknown
/// action's): at a terminal that file cannot drive it either.
#[test]
fn a_policy_files_text_cannot_drive_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let unknown = dir.path().join("unknown.cedar");
    std::fs::write(
        &unknown,
        "permit (principal, action, resource == Tool::\"x\u{1b}]52;c;aGk=\u{7}\u{9b}2J\u{202e}y\");\n",
    )
    .unwrap();
    let broken = dir.path().join("broken.cedar");
    std::fs::write(
        &broken,
        "permit (principal, action == Action::\"x\u{1b}]52;c;aGk=\u{7}\u{202e}\", resource);\n",
    )
    .unwrap();
    for file in [&unknown, &broken] {
        let out = at_terminal_in(
            dir.path(),
            &format!(
                "policy check --config-dir {d} --workdir {d} {}",
                file.display()
            ),
        );
        assert!(
            out.contains("]52;c;aGk="),
            "the file's text is quoted, escaped: {out:?}"
        );
        let raw = acting(&out);
        assert!(raw.is_empty(), "{raw:?} reach the terminal: {out:?}");
    }
}

#[test]
fn a_scripts_result_cannot_drive_the_terminal() {
    let out = at_terminal("", SCRIPT);
    assert!(out.contains("first line\n"), "lines stay lines: {out:?}");
    assert!(
        out.contains("A\\u001b]52;c;aGk=\\u0007B\\u001b[2KC\\u000dD\\u009b31mE\\u007fF\\u202eG"),
        "the escapes are shown as text: {out:?}"
    );
    let raw = acting(&out);
    assert!(raw.is_empty(), "{raw:?} reach the terminal: {out:?}");
    assert!(
        !out.contains("C\rD"),
        "a carriage return overwrites the line: {out:?}"
    );
}

#[test]
fn json_and_the_call_trace_cannot_drive_the_terminal_either() {
    let out = at_terminal("--json", SCRIPT);
    let raw = acting(&out);
    assert!(raw.is_empty(), "{raw:?} reach the terminal: {out:?}");
    let value: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("the escaped JSON is still JSON ({e}): {out:?}"));
    assert_eq!(
        value["value"].as_str(),
        Some(format!("first line\n{HOSTILE}").as_str()),
        "and says the same"
    );

    // The trace (-v, on stderr) quotes each call's arguments and error.
    let read = r#"try { await tools.read({ path: "gone\u001b]52;c;aGk=\u0007\u009b2K" }) } catch (e) {} return "done""#;
    let out = at_terminal("-v", read);
    assert!(out.contains("gone"), "the trace names the call: {out:?}");
    let raw = acting(&out);
    assert!(raw.is_empty(), "{raw:?} reach the terminal: {out:?}");
}

#[test]
fn piped_output_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = common::codemode();
    cmd.args(["run", "--config-dir"])
        .arg(dir.path())
        .arg("--workdir")
        .arg(dir.path())
        .arg("-");
    let out = common::pipe(cmd, Some(SCRIPT));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("first line\n{HOSTILE}\n")),
        "a pipe gets exactly what the script returned: {stdout:?}"
    );
}

/// What `codemode run` prints on stderr when `script`'s call pauses for approval (approvals
/// pause, nobody at a terminal): the notice, from its first line to the one saying how to answer.
fn paused_notice(config: &std::path::Path, work: &std::path::Path, script: &[u8]) -> String {
    std::fs::write(
        config.join("settings.json"),
        json!({"approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"}})
            .to_string(),
    )
    .unwrap();
    let mut child = common::codemode()
        .args(["run", "--config-dir"])
        .arg(config)
        .arg("--workdir")
        .arg(work)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(script).unwrap();
    }
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    let mut notice = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let asked = !notice.is_empty() || line.contains("waits for approval");
                if asked {
                    notice.push_str(&line);
                    notice.push('\n');
                }
                if asked && line.contains("answer with:") {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        notice.contains("waits for approval"),
        "the paused call is not announced on stderr: {notice:?}"
    );
    notice
}

#[test]
fn a_paused_calls_notice_shows_its_arguments_escaped() {
    // Codemode tells the person (on stderr) which call waits and with what arguments. They
    // decide on what they read there, so a command's right-to-left override or C1 CSI must not
    // reorder or hide it.
    let dir = tempfile::tempdir().unwrap();
    let (config, work) = (dir.path().join("config"), dir.path().join("work"));
    std::fs::create_dir(&config).unwrap();
    std::fs::create_dir(&work).unwrap();
    let notice = paused_notice(
        &config,
        &work,
        br#"return await tools.bash({ command: "echo \u202e txt.exe; rm -rf x \u009b2K" })"#,
    );
    let raw = acting(&notice);
    assert!(raw.is_empty(), "{raw:?} reach the terminal: {notice:?}");
    assert!(
        notice.contains("\\u202e txt.exe; rm -rf x \\u009b2K"),
        "the command is shown whole, its controls as text: {notice:?}"
    );
}

/// Red team: the notice of a paused call showed its tool, reason and arguments, and told the
/// person to answer with `codemode approvals approve <id>`, which takes short arguments without
/// a hash. It left out the paths the call reaches: `notes/x.txt` read through a link the project
/// ships lands in another directory (`~/.ssh` in the attack), and the person approving from the
/// notice never saw where. It shows the resolved paths, as the live question and `show` do.
#[test]
fn a_paused_calls_notice_shows_where_its_path_really_leads() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let work = dir.path().join("work");
    let outside = dir.path().join("outside");
    for d in [&config, &work, &outside] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(outside.join("x.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, work.join("notes")).unwrap();
    let notice = paused_notice(
        &config,
        &work,
        br#"return await tools.read({ path: "notes/x.txt" })"#,
    );
    let landing = outside.canonicalize().unwrap().join("x.txt");
    assert!(
        notice.contains(&landing.display().to_string()),
        "the notice does not say the read lands in {}: {notice}",
        landing.display()
    );
}
