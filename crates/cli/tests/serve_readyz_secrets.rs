//! Red team: `/readyz` answers without a token (load balancers probe it) and names the state
//! store. A PostgreSQL password given as a query parameter of `state.url`
//! (`postgres://user@host/db?password=…`, a form libpq and tokio-postgres take) was shown there
//! whole: only a password in the URL's user part was hidden.
//!
//! Needs PostgreSQL: `scripts/with-postgres cargo test -p codemode-cli --test suite serve_readyz_secrets::`.

use crate::common;

use std::io::{Read, Write};

use serde_json::json;

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SECRET: &str = "hunter2-in-the-query";

#[test]
fn readyz_never_shows_a_password_given_in_the_state_urls_query() {
    let Some(pg) = common::postgres_url_or_skip(
        "a password in the state URL's query stays off /readyz",
        "serve_readyz_secrets",
    ) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = common::fresh_database(&rt, &pg, "readyz");
    let sep = if db.contains('?') { '&' } else { '?' };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    let settings = json!({"state": {"url": format!("{db}{sep}password={SECRET}")}});
    std::fs::write(config.join("settings.json"), settings.to_string()).unwrap();
    let (child, url) = common::start_serving(
        common::codemode()
            .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
            .arg("--config-dir")
            .arg(&config)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--token", "a-token-0123456789"])
            .env_remove("CODEMODE_SERVE_TOKEN"),
    );
    let _server = Server(child);
    let addr = common::socket_address(&url);
    // No token: what anyone who reaches the port sees.
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("postgres"),
        "/readyz names the store: {answer}"
    );
    assert!(
        !answer.contains(SECRET),
        "/readyz showed the database password to a client without a token: {answer}"
    );
}
