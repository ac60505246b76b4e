//! Configuration through the real binary: policies from every source, hidden tools with their
//! reasons, and logs a client can read.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);

struct Dirs {
    config: tempfile::TempDir,
    state: tempfile::TempDir,
    project: tempfile::TempDir,
}

fn dirs() -> Dirs {
    let d = Dirs {
        config: tempfile::tempdir().unwrap(),
        state: tempfile::tempdir().unwrap(),
        project: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir_all(d.project.path().join(".codemode")).unwrap();
    std::fs::write(d.project.path().join("a.txt"), "a").unwrap();
    d
}

impl Dirs {
    fn user(&self, file: &str, text: &str) -> PathBuf {
        let p = self.config.path().join(file);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn project(&self, file: &str, text: &str) {
        std::fs::write(self.project.path().join(".codemode").join(file), text).unwrap();
    }
    fn cmd(&self, sub: &str) -> Command {
        let mut cmd = common::codemode();
        cmd.arg(sub)
            .arg("--config-dir")
            .arg(self.config.path())
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--workdir")
            .arg(self.project.path());
        cmd
    }
    fn run(&self, script: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
        let mut cmd = self.cmd("run");
        cmd.arg("--json").args(extra).arg("-");
        common::json_outcome(common::pipe(cmd, Some(script)))
    }
}

const TRY_LS_AND_FIND: &str = "const r = {}; for (const t of ['ls', 'find']) { try { await tools[t](t === 'find' ? { pattern: '*' } : {}); r[t] = 'ran' } catch (e) { r[t] = e.message } } return r";

#[test]
fn command_line_policies_replace_the_users_but_keep_the_projects_forbids() {
    let d = dirs();
    d.user(
        "mine.cedar",
        "@id(\"user-no-find\") forbid(principal, action, resource == Tool::\"find\");\npermit(principal, action, resource);",
    );
    d.user("settings.json", r#"{"policy": ["mine.cedar"]}"#);
    d.project("settings.json", r#"{"policy": ["no-ls.cedar"]}"#);
    d.project(
        "no-ls.cedar",
        "@id(\"project-no-ls\") forbid(principal, action, resource == Tool::\"ls\");",
    );
    let (code, v, stderr) = d.run(TRY_LS_AND_FIND, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        v["value"]["find"]
            .as_str()
            .unwrap()
            .contains("user-no-find"),
        "{v}"
    );
    assert!(
        v["value"]["ls"].as_str().unwrap().contains("project-no-ls"),
        "{v}"
    );

    let all = d.user("all.cedar", "permit(principal, action, resource);");
    let (code, v, stderr) = d.run(TRY_LS_AND_FIND, &["--policy", all.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        v["value"]["find"], "ran",
        "your policy files are replaced: {v}"
    );
    assert!(
        v["value"]["ls"].as_str().unwrap().contains("project-no-ls"),
        "the project's forbid stays: {v}"
    );
}

#[test]
fn an_untrusted_projects_permit_does_not_stop_start_up() {
    let d = dirs();
    d.project("settings.json", r#"{"policy": ["p.cedar"]}"#);
    d.project(
        "p.cedar",
        "@id(\"open-everything\") permit(principal, action, resource);\n@id(\"project-no-ls\") forbid(principal, action, resource == Tool::\"ls\");",
    );
    let (code, v, stderr) = d.run(
        "let w; try { await tools.write({ path: 'x.txt', content: 'x' }); w = 'ran' } catch (e) { w = e.message } return w",
        &[],
    );
    assert_eq!(code, Some(0), "start-up goes on: {stderr}");
    assert!(
        stderr.contains("ignored `permit policy `open-everything` (line 1)`"),
        "{stderr}"
    );
    assert!(
        v["value"]
            .as_str()
            .unwrap()
            .contains("needs the user's approval"),
        "the permit did not widen the built-in policy: {v}"
    );
}

#[test]
fn tools_lists_hidden_mcp_and_builtin_tools_with_the_reason() {
    let d = dirs();
    d.user(
        "mcp.json",
        &json!({"mcpServers": {"bad": {"command": "node", "args": [FIXTURE, TESTBED],
                "toolExposure": {"hang": "hidden", "die": "hidden"}}}})
        .to_string(),
    );
    d.user(
        "settings.json",
        r#"{"tools": {"bash": {"disabled": true}}}"#,
    );
    d.project(
        "settings.json",
        r#"{"tools": {"mcp__bad__pid": {"exposure": "hidden"}}}"#,
    );
    let out = common::pipe(d.cmd("tools"), None);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} is not listed:\n{listing}"))
            .to_string()
    };
    let hang = line("mcp__bad__hang");
    assert!(
        hang.contains("hidden") && hang.contains("MCP server \"bad\"") && hang.contains("mcp.json"),
        "{hang}"
    );
    let bash = line("bash");
    assert!(
        bash.contains("hidden: disabled in") && bash.contains("settings.json"),
        "{bash}"
    );
    let pid = line("mcp__bad__pid");
    assert!(
        pid.contains("hidden: exposure hidden in") && pid.contains(".codemode/settings.json"),
        "{pid}"
    );
    assert!(line("read").contains("allow"), "{listing}");
    assert!(line("write").contains("ask"), "{listing}");
}

fn serve_stderr(d: &Dirs) -> String {
    // stdin closes at once, so the server stops after start-up; its log goes to a pipe.
    let mut cmd = d.cmd("serve");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let d = dirs();
    d.user(
        "mcp.json",
        &json!({"mcpServers": {"broken": {"command": "x", "args": 3}}}).to_string(),
    );
    let stderr = serve_stderr(&d);
    assert!(stderr.contains("`mcpServers.broken.args`"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no ANSI escapes: {stderr:?}");
}

#[test]
fn a_vs_code_mcp_file_with_comments_runs_its_server() {
    let d = dirs();
    let file = d.config.path().join("vscode-mcp.json");
    std::fs::write(
        &file,
        format!(
            "// pasted from .vscode/mcp.json\n{{ \"servers\": {{ \"bad\": {{ \"type\": \"stdio\", \"command\": \"node\", \"args\": [\"{FIXTURE}\", \"${{env:CODEMODE_TESTBED_DIR}}\",], }}, }}, }}"
        ),
    )
    .unwrap();
    let all = d.user("all.cedar", "permit(principal, action, resource);");
    let mut cmd = d.cmd("run");
    cmd.env("CODEMODE_TESTBED_DIR", TESTBED)
        .args(["--json", "--mcp-config"])
        .arg(&file)
        .arg("--policy")
        .arg(&all)
        .arg("-");
    let (code, v, stderr) = common::json_outcome(common::pipe(
        cmd,
        Some("return (await tools.mcp__bad__echo({ text: 'hi' })).content[0].text"),
    ));
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert_eq!(v["value"], "Echo: hi", "{v}");
}
