//! The streamable HTTP transport as the MCP specification asks (issue 13, item 9).

use crate::common;

use std::process::Command;

use serde_json::Value;

const PROBE: &str = r#"
const [url, token] = process.argv.slice(1);
const init = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
const h = (extra) => Object.assign({ "content-type": "application/json", accept: "application/json, text/event-stream", authorization: "bearer " + token }, extra);
(async () => {
  const evil = await fetch(url, { method: "POST", headers: h({ origin: "http://evil.example" }), body: init });
  const local = await fetch(url, { method: "POST", headers: h({ origin: "http://localhost:3000" }), body: init });
  const malformed = await fetch(url, { method: "POST", headers: h({}), body: "{not json" });
  const malformedBody = await malformed.json().catch(() => null);
  const del = await fetch(url, { method: "DELETE", headers: h({ "mcp-session-id": "no-such-session" }) });
  const wrong = await fetch(url, { method: "POST", headers: h({ authorization: "Bearer nope" }), body: init });
  console.log(JSON.stringify({ evil: evil.status, local: local.status, malformed: malformed.status, malformedBody, del: del.status, wrong: wrong.status }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

#[test]
fn origin_malformed_json_unknown_sessions_bearer_case_and_host_names() {
    let config = tempfile::tempdir().unwrap();
    let (mut child, url) = common::start_serving(
        Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args([
                "serve",
                "--listen",
                "localhost:0",
                "--token",
                "s3cret",
                "--config-dir",
            ])
            .arg(config.path())
            .arg("--state-dir")
            .arg(config.path().join("state")),
    );
    let out = Command::new("node")
        .args(["-e", PROBE, &url, "s3cret"])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(
        v["evil"], 403,
        "a foreign Origin is refused (DNS rebinding): {v}"
    );
    assert_eq!(
        v["local"], 200,
        "a loopback page may call, and `bearer` in lower case works: {v}"
    );
    assert_eq!(v["malformed"], 400, "{v}");
    assert_eq!(v["malformedBody"]["error"]["code"], -32700, "{v}");
    assert_eq!(v["del"], 404, "DELETE of an unknown session: {v}");
    assert_eq!(v["wrong"], 401, "{v}");
}

const ORIGINS_PROBE: &str = r#"
const [url, token, ...origins] = process.argv.slice(1);
const init = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
(async () => {
  const out = {};
  for (const origin of origins) {
    const r = await fetch(url, { method: "POST", body: init, headers: { "content-type": "application/json",
      accept: "application/json, text/event-stream", authorization: "Bearer " + token, origin } });
    out[origin] = r.status;
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// An origin includes its port: an allowed origin without one allows only the scheme's default
/// port, and one with a port allows only that port.
#[test]
fn an_allowed_origin_matches_its_port_only() {
    let config = tempfile::tempdir().unwrap();
    let (mut child, url) = common::start_serving(
        Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args(["serve", "--listen", "localhost:0", "--token", "s3cret"])
            .args(["--allow-origin", "https://app.example.com"])
            .args(["--allow-origin", "http://b.example:8080"])
            .arg("--config-dir")
            .arg(config.path())
            .arg("--state-dir")
            .arg(config.path().join("state")),
    );
    let expected = [
        ("https://app.example.com", 200),
        ("https://app.example.com:443", 200),
        ("https://app.example.com:444", 403),
        ("http://app.example.com", 403),
        ("https://evil.app.example.com", 403),
        ("http://b.example:8080", 200),
        ("http://b.example", 403),
        ("http://b.example:8081", 403),
    ];
    let out = Command::new("node")
        .args(["-e", ORIGINS_PROBE, &url, "s3cret"])
        .args(expected.iter().map(|(o, _)| o))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    for (origin, status) in expected {
        assert_eq!(v[origin], status, "Origin {origin}: {v}");
    }
}

/// Red team: a loopback server without a token served every local user, and a client it serves
/// is also the one asked to approve its calls: another user's program ran `bash` as the user
/// serving, approving its own prompt. Without a token, only that user's programs get in.
#[test]
fn a_tokenless_loopback_server_refuses_other_users_programs() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: acting as another user needs root, and this test runs as another");
        return;
    }
    let config = tempfile::tempdir().unwrap();
    let (mut child, url) = serve_tokenless(config.path());
    let healthz = url.replace("/mcp", "/healthz");
    let curl = |as_nobody: bool| {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-w", "\n%{http_code}", &healthz]);
        if as_nobody {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(65534) != 0
                        || libc::setuid(65534) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = cmd.output().expect("curl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let other = curl(true);
    let own = curl(false);
    let _ = child.kill();
    let _ = child.wait();
    assert!(other.ends_with("\n403"), "{other}");
    assert!(other.contains("--token"), "{other}");
    assert!(own.ends_with("\n200"), "{own}");
}

/// Red team: a 4 MiB body of `[0,0,…]` took the server from 57 to 527 MB while the transport
/// decoded it, and eight at once to 1.9 GB. A body's JSON values are counted before anything
/// decodes it.
#[test]
fn a_body_of_too_many_json_values_is_refused_before_it_is_decoded() {
    let config = tempfile::tempdir().unwrap();
    let (mut child, url) = serve_tokenless(config.path());
    let post = |values: usize| {
        let pad = vec!["0"; values].join(",");
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"codemode","arguments":{{"code":"1","pad":[{pad}]}}}}}}"#
        );
        let file = config.path().join("body.json");
        std::fs::write(&file, body).unwrap();
        let out = Command::new("curl")
            .args([
                "-s",
                "-w",
                "\n%{http_code}",
                "-H",
                "content-type: application/json",
            ])
            .args(["-H", "accept: application/json, text/event-stream"])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg(&url)
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let many = post(200_000);
    let few = post(1_000);
    let _ = child.kill();
    let _ = child.wait();
    assert!(many.ends_with("\n400"), "{many}");
    assert!(
        many.contains("-32600") && many.contains("65536 JSON values"),
        "{many}"
    );
    // A body within the count goes on to the transport, which wants a session first.
    assert!(!few.contains("JSON values"), "{few}");
}

/// `codemode serve` on a loopback port, without a token, configured in `dir`.
fn serve_tokenless(dir: &std::path::Path) -> (std::process::Child, String) {
    common::start_serving(
        Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config-dir"])
            .arg(dir)
            .arg("--state-dir")
            .arg(dir.join("state")),
    )
}
