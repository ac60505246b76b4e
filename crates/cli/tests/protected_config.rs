//! The gate protects every file the configuration reads or runs, not only the configuration
//! directories: a policy file, a hook's program, an MCP server's program, a `--mcp-config` file
//! and the state database may live anywhere, even inside the workspace, and a script that may
//! write there must still not change them. Attacks as a black-box tester ran them, through the
//! real binary.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);

struct Dirs {
    config: tempfile::TempDir,
    state: tempfile::TempDir,
    project: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            config: tempfile::tempdir().unwrap(),
            state: tempfile::tempdir().unwrap(),
            project: tempfile::tempdir().unwrap(),
        }
    }
    fn in_project(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.project.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
    fn settings(&self, json: &Value) {
        std::fs::write(self.config.path().join("settings.json"), json.to_string()).unwrap();
    }
    fn run(&self, script: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
        let mut cmd = common::codemode();
        cmd.arg("run")
            .arg("--config-dir")
            .arg(self.config.path())
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--workdir")
            .arg(self.project.path())
            .arg("--json")
            .args(extra)
            .arg("-");
        common::json_outcome(common::pipe(cmd, Some(script)))
    }
}

/// Each write in `targets` (paths as the script names them), with what became of it: "ran" or
/// the refusal's stage.
fn try_writes(targets: &[&str]) -> String {
    let list = serde_json::to_string(targets).unwrap();
    format!(
        "const out = {{}};
for (const path of {list}) {{
  try {{ await tools.write({{ path, content: 'changed by a script' }}); out[path] = 'ran' }}
  catch (e) {{ out[path] = e.stage + ': ' + e.message }}
}}
try {{ await tools.edit({{ path: {first}, old_string: 'exit 0', new_string: 'touch pwned; exit 0' }}); out.edit = 'ran' }}
catch (e) {{ out.edit = e.stage + ': ' + e.message }}
return out;",
        first = serde_json::to_string(targets[0]).unwrap()
    )
}

fn refused(v: &Value, key: &str, why: &str) {
    let got = v["value"][key].as_str().unwrap_or_default();
    assert!(
        got.starts_with("protected: ") && got.contains(why),
        "{key} must be refused as {why}: {v}"
    );
}

fn unchanged(path: &Path, text: &str) {
    assert_eq!(std::fs::read_to_string(path).unwrap(), text, "{path:?}");
}

#[test]
fn policy_files_and_hook_programs_outside_the_configuration_directory_are_protected() {
    let d = Dirs::new();
    let hook_text = "#!/bin/sh\ncat >/dev/null\nexit 0\n";
    let hook = d.in_project("hooks/check.sh", hook_text);
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Writes in the workspace are permitted, bash is not: changing the hook's program or the
    // policy would turn a workspace write into host commands.
    let policy_text = "@id(\"ws-write\") permit (principal, action == Action::\"tool_call\", resource) when { [\"write\",\"edit\"].contains(resource.name) && context.in_workspace };";
    let policy = d.in_project("policy.cedar", policy_text);
    d.settings(&serde_json::json!({
        "policy": [policy],
        "hooks": {"PreToolUse": [{"matcher": "write|edit", "hooks": [
            {"type": "command", "command": hook.display().to_string(), "timeout": 10}
        ]}]}
    }));
    let script = try_writes(&[
        "hooks/check.sh",
        "./hooks/../hooks/check.sh",
        "policy.cedar",
        &policy.display().to_string(),
        "ordinary.txt",
    ]);
    let (code, v, stderr) = d.run(&script, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    refused(&v, "hooks/check.sh", "a program a hook runs");
    refused(&v, "./hooks/../hooks/check.sh", "a program a hook runs");
    refused(&v, "edit", "a program a hook runs");
    refused(&v, "policy.cedar", "a policy file in force");
    refused(&v, &policy.display().to_string(), "a policy file in force");
    assert_eq!(
        v["value"]["ordinary.txt"], "ran",
        "the policy does permit workspace writes: {v}"
    );
    unchanged(&hook, hook_text);
    unchanged(&policy, policy_text);
    assert!(!d.project.path().join("pwned").exists());

    // A policy given with --policy is protected for that run too.
    let cli_policy = d.in_project("cli.cedar", "permit (principal, action, resource);");
    let (code, v, stderr) = d.run(
        &try_writes(&["cli.cedar"]),
        &["--policy", cli_policy.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    refused(&v, "cli.cedar", "a policy file in force");
}

/// Hook command lines that name their program through shell syntax or a variable (found by
/// red-team runs: each of these programs was writable).
#[test]
fn hook_programs_named_through_cd_redirections_and_sh_c_are_protected() {
    let d = Dirs::new();
    let hook_text = "#!/bin/sh\ncat >/dev/null\nexit 0\n";
    let mut programs = Vec::new();
    for rel in [
        "hooks/in_cd.sh",
        "hooks/redirected.sh",
        "hooks/via_sh.sh",
        "hooks/via_var.sh",
    ] {
        let p = d.in_project(rel, hook_text);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        programs.push(p);
    }
    let hooks_dir = d.project.path().join("hooks");
    let commands = [
        format!("cd {} && ./in_cd.sh", hooks_dir.display()),
        format!("{}</dev/null", programs[1].display()),
        format!("sh -c 'exec {}'", programs[2].display()),
        "$CODEMODE_PROJECT_DIR/hooks/via_var.sh".to_string(),
    ];
    let hooks: Vec<Value> = commands
        .iter()
        .map(|c| serde_json::json!({"type": "command", "command": c, "timeout": 10}))
        .collect();
    let policy_text = "@id(\"ws-write\") permit (principal, action == Action::\"tool_call\", resource) when { [\"write\",\"edit\"].contains(resource.name) && context.in_workspace };";
    let policy = d.in_project("policy.cedar", policy_text);
    d.settings(&serde_json::json!({
        "policy": [policy],
        "hooks": {"PreToolUse": [{"matcher": "write|edit", "hooks": hooks}]}
    }));
    let targets = [
        "hooks/in_cd.sh",
        "hooks/redirected.sh",
        "hooks/via_sh.sh",
        "hooks/via_var.sh",
    ];
    let (code, v, stderr) = d.run(&try_writes(&targets), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    for t in targets {
        refused(&v, t, "a program a hook runs");
    }
    for p in &programs {
        unchanged(p, hook_text);
    }
}

#[test]
fn the_state_database_and_state_directory_are_protected_whatever_the_policy() {
    let d = Dirs::new();
    let db = d.project.path().join("st").join("state.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    d.settings(&serde_json::json!({
        "state": {"url": format!("sqlite://{}", db.display()), "audit_stream": "team"}
    }));
    let allow = d.in_project("allow.cedar", "permit (principal, action, resource);");
    let allow = allow.to_str().unwrap();
    // A first run writes audit lines into the database.
    let (code, _, stderr) = d.run("return 1", &["--policy", allow]);
    assert_eq!(code, Some(0), "{stderr}");
    let before = std::fs::read(&db).unwrap();
    assert!(!before.is_empty());

    let default_db = d.state.path().join("state.db").display().to_string();
    let key = d.state.path().join("audit.key").display().to_string();
    let (code, v, stderr) = d.run(
        &try_writes(&[
            "st/state.db",
            "st/state.db-wal",
            "st/state.db-journal",
            &default_db,
            &key,
        ]),
        &["--policy", allow],
    );
    assert_eq!(code, Some(0), "{stderr}");
    refused(&v, "st/state.db", "codemode's state database");
    refused(&v, "st/state.db-wal", "codemode's state database");
    // Not there yet, so only the directory can keep it: SQLite would play it back.
    refused(&v, "st/state.db-journal", "codemode's state database");
    refused(&v, &default_db, "codemode's state");
    refused(&v, &key, "the audit log's key");
    assert!(!std::fs::read(&db).unwrap().is_empty());

    // The history is whole: every run so far verifies as one chain with more than one line.
    let mut verify = common::codemode();
    verify
        .args(["audit", "verify", "--state"])
        .arg(format!("sqlite://{}", db.display()))
        .args(["--stream", "team", "--key"])
        .arg(d.state.path().join("audit.key"));
    let out = common::pipe(verify, None);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("intact, 8 lines"),
        "both runs' codemode calls and the six refused changes are there: {text}"
    );
    assert!(
        !text.contains("UNFINISHED"),
        "every script journalled before it ran has its outcome line: {text}"
    );
}

/// Whoever holds the audit key can forge the log, so not even a policy that permits every read
/// lets a script read it: not by its path, a symlink or a hard link in the project, nor by
/// searching the state directory byte by byte.
#[test]
fn no_script_can_read_the_audit_key_whatever_the_policy() {
    let d = Dirs::new();
    let log = d.project.path().join("audit.jsonl");
    d.settings(&serde_json::json!({"audit": {"path": log}}));
    let allow = d.in_project("allow.cedar", "permit (principal, action, resource);");
    let allow = allow.to_str().unwrap();
    let (code, _, stderr) = d.run("return 1", &["--policy", allow]);
    assert_eq!(code, Some(0), "{stderr}");
    let key_path = d.state.path().join("audit.key");
    let key = std::fs::read_to_string(&key_path).unwrap();
    let hex = key.trim();
    assert_eq!(hex.len(), 64, "the key is kept as hex text: {key:?}");
    std::os::unix::fs::symlink(&key_path, d.project.path().join("k-sym")).unwrap();
    std::fs::hard_link(&key_path, d.project.path().join("k-hard")).unwrap();
    let state = d.state.path().display().to_string();
    let key_shown = key_path.display().to_string();
    let script = format!(
        "const out = {{}};
const attempt = async (label, f) => {{
  try {{ out[label] = JSON.stringify(await f()) }} catch (e) {{ out[label] = e.stage + ': ' + e.message }}
}};
for (const path of [{key:?}, 'k-sym', 'k-hard']) {{
  await attempt('read ' + path, () => tools.read({{ path }}));
  await attempt('grep ' + path, () => tools.grep({{ pattern: '^[0-9a-f]', path }}));
}}
await attempt('grep state', () => tools.grep({{ pattern: '[0-9a-f]{{16}}', path: {state:?} }}));
await attempt('grep project', () => tools.grep({{ pattern: '[0-9a-f]{{16}}', glob: 'k-*' }}));
return out;",
        key = key_shown,
        state = state,
    );
    let (code, v, stderr) = d.run(&script, &["--policy", allow]);
    assert_eq!(code, Some(0), "{stderr}");
    let out = &v["value"];
    for label in [format!("read {key_shown}"), format!("grep {key_shown}")] {
        refused(&v, &label, "the audit log's key");
    }
    for label in ["read k-sym", "grep k-sym"] {
        refused(&v, label, "the audit log's key");
    }
    for label in ["read k-hard", "grep k-hard"] {
        let got = out[label].as_str().unwrap_or_default();
        assert!(got.contains("audit key"), "{label} must be refused: {v}");
    }
    for label in ["grep state", "grep project"] {
        let got = out[label].as_str().unwrap_or_default();
        assert!(
            got.starts_with('{') && !got.contains("audit.key") && !got.contains("k-hard"),
            "{label} must run and skip the key: {v}"
        );
    }
    assert!(
        !v.to_string().contains(&hex[..16]),
        "no part of the key came back: {v}"
    );
    assert_eq!(std::fs::read_to_string(&key_path).unwrap(), key);
}

#[test]
fn an_mcp_config_file_and_a_servers_program_are_protected() {
    let d = Dirs::new();
    let server = d.in_project(
        "servers/tool-server.cjs",
        &std::fs::read_to_string(FIXTURE).unwrap(),
    );
    let mcp = d.in_project(
        "mcp.json",
        &serde_json::json!({"mcpServers": {"local": {
            "command": "node",
            "args": [server, common::testbed()],
        }}})
        .to_string(),
    );
    let allow = d.in_project("allow.cedar", "permit (principal, action, resource);");
    let (code, v, stderr) = d.run(
        &try_writes(&["servers/tool-server.cjs", "mcp.json"]),
        &[
            "--policy",
            allow.to_str().unwrap(),
            "--mcp-config",
            mcp.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    refused(
        &v,
        "servers/tool-server.cjs",
        "a program MCP server `local` runs",
    );
    refused(&v, "mcp.json", "a configuration file codemode reads");
    unchanged(&server, &std::fs::read_to_string(FIXTURE).unwrap());
}

/// SQLite plays back a `-journal` it finds beside a database, WAL mode or not: a program able
/// to create that name could write the database. So the database's whole directory is kept,
/// from `bash` too, and a database whose directory holds the project is refused at start.
#[test]
fn nothing_can_plant_a_journal_beside_the_state_database() {
    let d = Dirs::new();
    let db = d.project.path().join("st").join("state.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    d.settings(&serde_json::json!({"state": {"url": format!("sqlite://{}", db.display())}}));
    let allow = d.in_project("allow.cedar", "permit (principal, action, resource);");
    let allow = allow.to_str().unwrap();
    let script = format!(
        "return (await tools.bash({{ command: {:?} }})).output",
        "echo planted > st/state.db-journal; echo planted > st/other; echo tried"
    );
    let (code, v, stderr) = d.run(&script, &["--policy", allow]);
    assert_eq!(code, Some(0), "{v} {stderr}");
    let out = v["value"].as_str().unwrap_or_default();
    if !stderr.contains("unconfined") {
        assert!(out.contains("Read-only file system"), "{out}");
        assert!(!db.with_extension("db-journal").exists(), "{out}");
        assert!(!db.with_file_name("other").exists(), "{out}");
    }

    d.settings(&serde_json::json!({
        "state": {"url": format!("sqlite://{}", d.project.path().join("state.db").display())}
    }));
    let (code, v, stderr) = d.run("return 1", &["--policy", allow]);
    assert_ne!(code, Some(0), "{v}");
    assert!(
        stderr.contains("holds the project") && stderr.contains("directory of its own"),
        "{stderr}"
    );
}

/// On a case-insensitive file system (macOS and Windows by default, a vfat or SMB mount, an
/// ext4 directory with casefold) `.CODEMODE/settings.json` is the project's settings file, and
/// HFS+ ignores zero-width joiners in names too. A path that spells a protected one another
/// way is protected as well, whatever this file system does with it.
#[test]
fn a_protected_name_spelt_in_another_case_is_protected() {
    let d = Dirs::new();
    let settings = d.in_project(".codemode/settings.json", "{}");
    let policy = d.config.path().join("ws.cedar");
    std::fs::write(
        &policy,
        "@id(\"ws-write\") permit (principal, action == Action::\"tool_call\", resource) when { [\"write\",\"edit\"].contains(resource.name) && context.in_workspace };",
    )
    .unwrap();
    // The user's configuration directory with its own name's case changed.
    let config_dir = d.config.path();
    let config_name = config_dir.file_name().unwrap().to_string_lossy();
    let config_upper = config_dir
        .with_file_name(config_name.to_uppercase())
        .join("settings.json")
        .display()
        .to_string();
    let spellings = [
        ".CODEMODE/settings.json",
        ".Codemode/settings.json",
        ".codeMODE/hooks.sh",
        ".code\u{200c}mode/settings.json",
        ".codemode./settings.json",
        &config_upper,
    ];
    let mut targets = spellings.to_vec();
    targets.push("ordinary.txt");
    let (code, v, stderr) = d.run(
        &try_writes(&targets),
        &["--policy", policy.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for path in &spellings[..5] {
        refused(&v, path, "the project's codemode configuration");
    }
    refused(&v, &config_upper, "your codemode configuration");
    refused(&v, "edit", "the project's codemode configuration");
    assert_eq!(
        v["value"]["ordinary.txt"], "ran",
        "the policy does permit workspace writes: {v}"
    );
    unchanged(&settings, "{}");
}
