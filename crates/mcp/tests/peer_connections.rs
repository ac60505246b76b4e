//! One peer cannot hold every connection the server can open. `/healthz` needs no token, so a
//! peer asking for it every few seconds keeps a connection from ever being idle; thousands of
//! such connections would use up the process's descriptors and lock out clients with tokens.
//! Past its share a peer's new connections are closed at once, and others' are served.

use std::net::SocketAddr;
use std::time::Duration;

use codemode_gate::{Gate, PolicySet, Registry};
use codemode_mcp::{ElicitationApprover, HttpOptions, ServeOptions, serve_http};
use codemode_runtime::Codemode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Asks for `/healthz` on `stream` and says whether an answer came (false: closed unanswered).
async fn healthz(stream: &mut TcpStream) -> bool {
    let ask = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if stream.write_all(ask).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => buf[..n].starts_with(b"HTTP/1.1 200"),
        _ => false,
    }
}

/// The address this machine would send from, if it has one other than loopback (no packet
/// is sent: connecting a UDP socket only picks the route).
fn own_non_loopback_ip() -> Option<String> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_holding_its_share_of_connections_gets_no_more_and_others_still_do() {
    let gate = Gate::builder()
        .registry(Registry::new())
        .policy(PolicySet::parse("p.cedar", "").unwrap())
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate).build().unwrap();
    let addrs: [SocketAddr; 1] = ["127.0.0.1:0".parse().unwrap()];
    let server = serve_http(
        codemode,
        &addrs,
        HttpOptions {
            bearer_token: Some("t0k3n".into()),
            // The default is 1,024; a smaller share keeps the test's descriptors few.
            max_connections_per_peer: 64,
            ..HttpOptions::default()
        },
        ElicitationApprover::new(),
        ServeOptions::default(),
    )
    .await
    .unwrap();
    let port = server.local_addr.port();

    // The flooding peer connects from 127.0.0.2 and keeps every connection busy.
    let connect_from = |ip: &str| {
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(local).unwrap();
            socket
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap()
        }
    };
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut stream = connect_from("127.0.0.2").await;
        assert!(healthz(&mut stream).await, "a connection within the share");
        held.push(stream);
    }
    let mut over = connect_from("127.0.0.2").await;
    assert!(
        !healthz(&mut over).await,
        "the 65th connection of one peer must be closed unanswered"
    );
    // Every loopback address is the same peer: a program cannot get more by choosing another.
    let mut sibling = connect_from("127.0.0.3").await;
    assert!(
        !healthz(&mut sibling).await,
        "127.0.0.3 is the same loopback peer as 127.0.0.2"
    );
    // Another peer (this machine's own non-loopback address, where it has one) is served.
    if let Some(ip) = own_non_loopback_ip() {
        let mut other = connect_from(&ip).await;
        assert!(healthz(&mut other).await, "another peer is still served");
    } else {
        eprintln!("SKIPPED: part of this test: the machine has no non-loopback IPv4 address");
    }

    // Once the peer lets go, it is served again.
    drop(held);
    let mut again = None;
    for _ in 0..50 {
        let mut stream = connect_from("127.0.0.2").await;
        if healthz(&mut stream).await {
            again = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again.is_some(), "the peer's share came back");
    server.stop().await;
}
