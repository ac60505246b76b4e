//! Red team: what `codemode approvals list` and `show` print for a person on duty to decide on
//! comes from the script (its call's arguments) and from hooks (the reason). Characters that
//! reorder text (bidi overrides), and C1 controls a terminal may act on, must be shown escaped,
//! or a script could make `rm -rf ~` read as something harmless. And the resolved paths a
//! call reaches (links followed) must be shown, as the live question shows them.

use crate::common;

use std::time::Duration;

use codemode_state::NewApproval;
use serde_json::json;

const RLO: char = '\u{202e}';
const CSI: char = '\u{9b}';

#[test]
fn approvals_are_shown_with_reordering_and_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["config", "state", "project", "db"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let url = format!("sqlite://{}", root.join("db/state.db").display());
    std::fs::write(
        root.join("config/settings.json"),
        json!({"state": {"url": url}, "audit": {"path": root.join("audit.jsonl")}}).to_string(),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(codemode_state::open(&url, Default::default()))
        .unwrap();
    // Shown in a terminal, the override makes the command read "echo hello ~ fr- mr".
    let command = format!("rm -rf ~ {RLO}olleh ohce{CSI}2J");
    let approval = rt
        .block_on(store.create_approval(NewApproval {
            cell_id: None,
            session_id: "s1".into(),
            tool: "bash".into(),
            arguments: json!({ "command": command }),
            provenance: json!({"session_id": "s1", "depth": 1}),
            // Where the call really lands, through a link: `notes` leads out of the project.
            // The override in it must be escaped like the arguments.
            paths: vec!["/outside/x.txt".into(), format!("/outside/{RLO}txt.exe")],
            policy_ids: vec!["ask-bash".into()],
            reason: format!("a hook says: {RLO}fine{CSI}0m"),
            expires_in: Duration::from_secs(600),
        }))
        .unwrap();
    drop(store);
    let dirs = [
        "--config-dir".to_string(),
        root.join("config").display().to_string(),
        "--state-dir".into(),
        root.join("state").display().to_string(),
        "--workdir".into(),
        root.join("project").display().to_string(),
    ];
    for args in [vec!["list"], vec!["show", approval.id.as_str()]] {
        let mut cmd = common::codemode();
        cmd.arg("approvals").args(&args).args(&dirs);
        let out = common::pipe(cmd, None);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(text.contains("rm -rf ~"), "{args:?}: {text}");
        assert!(
            !text.contains(RLO) && !text.contains(CSI),
            "{args:?} prints a character that reorders or controls the terminal: {text:?}"
        );
        assert!(text.contains("\\u202e"), "{args:?}: {text}");
        // Red team: `approvals show` printed only the arguments, and the person approved a
        // write that landed in /outside through a link. Shown as the live question shows it.
        assert!(
            text.contains("Paths it reaches (resolved, links followed):\n"),
            "{args:?}: {text}"
        );
        assert!(text.contains("  /outside/x.txt\n"), "{args:?}: {text}");
        assert!(
            text.contains("  /outside/\\u202etxt.exe"),
            "{args:?}: {text}"
        );
    }
    // Red team: answering printed the call it answered raw (its arguments as plain JSON), so
    // the override and the CSI reached the terminal there.
    let mut cmd = common::codemode();
    cmd.args(["approvals", "deny", approval.id.as_str()])
        .args(&dirs);
    let out = common::pipe(cmd, None);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "deny: {text}");
    assert!(text.contains("rm -rf ~"), "deny: {text}");
    assert!(
        !text.contains(RLO) && !text.contains(CSI),
        "deny prints a character that reorders or controls the terminal: {text:?}"
    );
}
