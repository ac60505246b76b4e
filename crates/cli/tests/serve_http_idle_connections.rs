//! Red team: connections that send no request hold a descriptor each, before any token is
//! checked. HTTP/1.1 headers have a read timeout; these are the ways around it.

use crate::common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &std::path::Path) -> (Server, String) {
    let (child, url) = common::start_serving(
        common::codemode()
            .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
            .arg("--config-dir")
            .arg(dir.join("config"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--token", "a-token-0123456789"])
            .env_remove("CODEMODE_SERVE_TOKEN"),
    );
    let addr = common::socket_address(&url);
    (Server(child), addr)
}

/// Reads until the server closes the connection, or 40 s; returns how long it held it.
fn held(mut conn: std::net::TcpStream) -> Duration {
    conn.set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

/// HTTP/2 with prior knowledge (h2c): the connection preface and an empty SETTINGS frame, then
/// nothing. The HTTP/1.1 header timeout does not apply to it.
#[test]
fn an_h2c_connection_that_never_sends_a_request_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = serve(dir.path());
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let waited = held(conn);
    assert!(
        waited < Duration::from_secs(30),
        "an h2c connection without a request was held for {waited:?}"
    );
}

/// HTTP/1.1 keep-alive: one request answered (401, no token), then nothing.
#[test]
fn an_idle_keep_alive_connection_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = serve(dir.path());
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let waited = held(conn);
    assert!(
        waited < Duration::from_secs(30),
        "an idle keep-alive connection was held for {waited:?}"
    );
}
