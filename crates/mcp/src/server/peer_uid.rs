//! Who is at the other end of a loopback TCP connection.
//!
//! A loopback listener without a token trusts whoever connects; on a machine with other users
//! that is every one of them, and a client that connects is also the one asked to approve its
//! own calls. So such a listener serves only processes of the user it runs as. The kernel
//! lists every TCP socket with its owner in `/proc/net/tcp` and `/proc/net/tcp6`: the client's
//! socket is the one whose local address is the connection's peer and whose remote address is
//! the connection's local one, and it is listed for as long as the connection is open.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The uid owning the client's end of the loopback connection from `peer` to `local`; `None`
/// when it cannot be found (the client already closed, or there is no `/proc`).
pub(crate) fn loopback_peer_uid(local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|file| {
        let table = std::fs::read_to_string(file).ok()?;
        owner_in(&table, local, peer)
    })
}

/// The uid of the line of `table` (a `/proc/net/tcp*` text) for the socket at `peer` connected
/// to `local`.
fn owner_in(table: &str, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (own, remote, uid) = (cols.get(1)?, cols.get(2)?, cols.get(7)?);
        (same(parse_addr(own)?, peer) && same(parse_addr(remote)?, local))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// Equal, reading an IPv4-mapped IPv6 address as the IPv4 one.
fn same(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && plain_ip(a.ip()) == plain_ip(b.ip())
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) as the IPv4 one; any other as it is.
pub(crate) fn plain_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word of the address
/// in the kernel's byte order, which is little-endian on the machines codemode runs on.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_le_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 101 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0000000000000000 20 4 30 10 -1
";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:D432 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 103 1 0000000000000000 20 4 30 10 -1
   1: 0000000000000000FFFF00000100007F:D433 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 104 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn the_clients_end_is_found_by_both_addresses() {
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        // Line 1 is the client's end (owned by 65534); line 2 the server's own (0).
        assert_eq!(owner_in(TCP, server, client), Some(65534));
        let unknown: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(owner_in(TCP, server, unknown), None);
    }

    #[test]
    fn ipv6_and_ipv4_mapped_ends_are_read() {
        let server6: SocketAddr = "[::1]:8080".parse().unwrap();
        let client6: SocketAddr = "[::1]:54322".parse().unwrap();
        assert_eq!(owner_in(TCP6, server6, client6), Some(1000));
        // A client on an IPv6 socket reaching an IPv4 listener shows as ::ffff:127.0.0.1.
        let server4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client4: SocketAddr = "127.0.0.1:54323".parse().unwrap();
        assert_eq!(owner_in(TCP6, server4, client4), Some(1001));
    }

    #[test]
    fn this_processs_own_connection_is_its_own() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(local).unwrap();
        let (_conn, peer) = listener.accept().unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(loopback_peer_uid(local, peer), Some(me));
    }
}
