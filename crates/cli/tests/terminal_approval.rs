//! At a terminal, `codemode run` asks before a call the policy marks `@ask`. `script(1)` gives
//! the command a real pseudo-terminal; the answer is typed into it.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

fn at_terminal(script: &str, answers: &str) -> String {
    at_terminal_in(|_| {}, script, answers)
}

/// As [`at_terminal`], with `prepare` making what the workspace holds first.
fn at_terminal_in(prepare: impl FnOnce(&std::path::Path), script: &str, answers: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    prepare(dir.path());
    let file = dir.path().join("s.js");
    std::fs::write(&file, script).unwrap();
    let command = format!(
        "{} run --config-dir {} --workdir {} {}",
        env!("CARGO_BIN_EXE_codemode"),
        dir.path().display(),
        dir.path().display(),
        file.display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux runs");
    let mut stdin = child.stdin.take().unwrap();
    let answers = answers.to_string();
    // Type each answer after the question had time to appear; keep the pty open until the end.
    let typist = std::thread::spawn(move || {
        for line in answers.lines() {
            std::thread::sleep(Duration::from_millis(1500));
            let _ = writeln!(stdin, "{line}");
        }
        std::thread::sleep(Duration::from_millis(1500));
    });
    let out = child.wait_with_output().unwrap();
    typist.join().unwrap();
    String::from_utf8_lossy(&out.stdout).replace('\r', "")
}

#[test]
fn yes_runs_the_call_and_no_refuses_it() {
    let script = "const r = await tools.bash({ command: \"echo approved-run\" }); return r.output";
    let yes = at_terminal(script, "y");
    assert!(yes.contains("Allow? [y]es"), "{yes}");
    assert!(
        yes.contains("Script completed") && yes.contains("approved-run"),
        "{yes}"
    );
    let no = at_terminal(script, "n");
    assert!(no.contains("Script failed"), "{no}");
    assert!(no.contains("was not approved"), "{no}");
}

#[test]
fn always_asks_once_for_the_rest_of_the_script() {
    let script = "await tools.bash({ command: \"true\" }); await tools.bash({ command: \"true\" }); return \"both ran\"";
    let out = at_terminal(script, "a");
    assert_eq!(out.matches("Allow? [y]es").count(), 1, "{out}");
    assert!(out.contains("both ran"), "{out}");
}

#[test]
fn the_question_shows_the_whole_command_however_it_is_padded() {
    // Padding used to push the end of a command past the question's cut, so a person approved
    // `ls` and ran the rest.
    let script = "return await tools.bash({ command: \"ls\" + \" \".repeat(3000) + \"; echo hidden-tail\\u001b[2K\" })";
    let out = at_terminal(script, "n");
    let question = out
        .split("Allow? [y]es")
        .next()
        .expect("the question was asked");
    assert!(
        question.contains("; echo hidden-tail\\u001b[2K\"}"),
        "the end of the command is in the question, its escape shown as text: {out}"
    );
    assert!(
        !question.contains('\u{1b}'),
        "no raw escape reaches the terminal"
    );
    assert!(out.contains("was not approved"), "{out}");
}

/// Red team: the question showed the arguments only, so a write to `docs/notes.md` was approved
/// while `docs` was a link the project shipped into another directory (`~/.ssh` in the attack).
/// The question shows the resolved paths the call reaches.
#[test]
fn the_question_shows_where_a_path_really_leads() {
    let script = "return await tools.write({ path: 'docs/notes.md', content: 'x' })";
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().canonicalize().unwrap();
    let out = at_terminal_in(
        |dir| std::os::unix::fs::symlink(&target, dir.join("docs")).unwrap(),
        script,
        "n",
    );
    let question = out
        .split("Allow? [y]es")
        .next()
        .expect("the question was asked");
    assert!(question.contains("Paths it reaches"), "{out}");
    let landing = format!("{}/notes.md", target.display());
    assert!(question.contains(&landing), "{landing} not in: {out}");
    assert!(out.contains("was not approved"), "{out}");
}
