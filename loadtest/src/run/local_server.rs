//! The local processes behind a run's database contact points, found
//! through `/proc`: the sockets listening on each address
//! (`/proc/net/tcp`, `/proc/net/tcp6`) and the processes holding them. When
//! the database runs on the same machine as the engine (Cassandra on the
//! two cores of the measurements), its CPU time over the delivery interval
//! is its share of every delivery, reported beside the engine's.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::engine_process::proc_sample;

/// TCP state LISTEN in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// The processes listening on `addrs` (an unspecified address listening on
/// the port counts), each once. Empty when `/proc` cannot tell (another OS,
/// another user's process, a database elsewhere).
pub fn listening_pids(addrs: &[SocketAddr]) -> Vec<u32> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        inodes.extend(text.lines().skip(1).filter_map(|line| listening_inode(line, addrs)));
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            let link = std::fs::read_link(fd.path()).unwrap_or_default();
            let link = link.to_string_lossy();
            let inode = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']'));
            inode.and_then(|i| i.parse::<u64>().ok()).is_some_and(|i| inodes.contains(&i))
        });
        if holds {
            pids.push(pid);
        }
    }
    pids
}

/// The summed CPU time (user + system, seconds) of `pids`; `None` when one
/// of them is gone.
pub fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|&pid| proc_sample(pid).map(|s| s.cpu_seconds)).sum()
}

/// The socket inode of a `/proc/net/tcp{,6}` line when it listens on one of
/// `addrs`.
fn listening_inode(line: &str, addrs: &[SocketAddr]) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
    if *state != LISTEN {
        return None;
    }
    let listening = parse_local(local)?;
    let matches = addrs
        .iter()
        .any(|a| a.port() == listening.port() && (listening.ip().is_unspecified() || listening.ip() == a.ip()));
    matches.then(|| inode.parse().ok()).flatten()
}

/// `0100007F:2352` (IPv4) or 32 hex digits and a port (IPv6): the address
/// as the kernel prints it, each 32-bit word in host (little-endian) order.
fn parse_local(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    if addr.len() % 8 != 0 {
        return None;
    }
    // Each word as the kernel held it: its bytes in native order.
    let bytes: Vec<u8> = (0..addr.len() / 8)
        .map(|i| addr.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()))
        .collect::<Option<Vec<u32>>>()?
        .into_iter()
        .flat_map(u32::to_ne_bytes)
        .collect();
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_addresses_parse_in_host_order() {
        assert_eq!(parse_local("0100007F:2352"), Some("127.0.0.1:9042".parse().unwrap()));
        assert_eq!(parse_local("00000000:1F90"), Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(parse_local("00000000000000000000000001000000:2352"), Some("[::1]:9042".parse().unwrap()));
        assert_eq!(parse_local("garbage"), None);
    }

    #[test]
    fn only_listening_sockets_on_the_address_or_any_address_count() {
        let cql: [SocketAddr; 1] = ["127.0.0.1:9042".parse().unwrap()];
        let line = |local: &str, state: &str| {
            format!("  0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 0 0 4242 1")
        };
        assert_eq!(listening_inode(&line("0100007F:2352", "0A"), &cql), Some(4242));
        assert_eq!(listening_inode(&line("00000000:2352", "0A"), &cql), Some(4242), "any address");
        assert_eq!(listening_inode(&line("0100007F:2352", "01"), &cql), None, "an established connection");
        assert_eq!(listening_inode(&line("0200007F:2352", "0A"), &cql), None, "another address");
        assert_eq!(listening_inode(&line("0100007F:2353", "0A"), &cql), None, "another port");
    }

    #[test]
    fn this_process_is_found_behind_its_own_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let pids = listening_pids(&[listener.local_addr().unwrap()]);
        assert_eq!(pids, vec![std::process::id()]);
        assert!(cpu_seconds(&pids).is_some());
    }
}
