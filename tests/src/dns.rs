//! A real DNS server on 127.0.0.1 for end-to-end tests of webhook resolution
//! (PUSH-256). It answers A and AAAA queries from an in-memory zone over UDP
//! and TCP on the same port: NOERROR with the records, NOERROR with an empty
//! answer for a zone name without records of the asked type, NXDOMAIN for a
//! name outside the zone. Records carry TTL 0, so a change made with
//! `TestDns::set` (a rebinding host) is seen by the next lookup.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::{JoinHandle, JoinSet};

type Zone = Arc<RwLock<HashMap<String, Vec<IpAddr>>>>;

/// A running test DNS server. Its tasks stop when it is dropped.
pub struct TestDns {
    /// UDP and TCP both listen here.
    pub addr: SocketAddr,
    zone: Zone,
    tasks: Vec<JoinHandle<()>>,
}

/// Start a server for `zone`: (name, addresses) pairs; names are
/// case-insensitive, with or without a trailing dot; repeated names merge.
pub async fn start(zone: Vec<(String, Vec<IpAddr>)>) -> anyhow::Result<TestDns> {
    let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for (name, addrs) in zone {
        map.entry(normalize(&name)).or_default().extend(addrs);
    }
    let zone: Zone = Arc::new(RwLock::new(map));
    let (udp, tcp) = bind_pair().await?;
    let addr = udp.local_addr()?;
    let tasks = vec![tokio::spawn(serve_udp(udp, zone.clone())), tokio::spawn(serve_tcp(tcp, zone.clone()))];
    Ok(TestDns { addr, zone, tasks })
}

impl TestDns {
    /// Replace a name's addresses (an empty list keeps the name with no
    /// records, so it answers NOERROR with no answer).
    pub fn set(&self, name: &str, addrs: Vec<IpAddr>) {
        self.zone.write().expect("zone lock").insert(normalize(name), addrs);
    }

    /// Remove a name, so it answers NXDOMAIN.
    pub fn remove(&self, name: &str) {
        self.zone.write().expect("zone lock").remove(&normalize(name));
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The names every end-to-end test may use, under `fanout.test`: one public
/// name (registration only; nothing may ever connect to it), one name per
/// blocked address class, `mixed`, `empty`, and `receiver` (127.0.0.1, for a
/// real receiver under allow_private_addresses).
pub fn standard_zone() -> Vec<(String, Vec<IpAddr>)> {
    let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
    let v6 = |s: &str| IpAddr::V6(s.parse::<Ipv6Addr>().expect("valid IPv6 literal"));
    let entries: Vec<(&str, Vec<IpAddr>)> = vec![
        ("public", vec![v4(93, 184, 216, 34), v6("2606:2800:220:1:248:1893:25c8:1946")]),
        ("private10", vec![v4(10, 0, 0, 1)]),
        ("private172", vec![v4(172, 16, 0, 1)]),
        ("private192", vec![v4(192, 168, 1, 1)]),
        ("ula", vec![v6("fc00::1")]),
        ("shared", vec![v4(100, 64, 0, 1)]),
        ("sitelocal", vec![v6("fec0::1")]),
        ("loopback", vec![v4(127, 0, 0, 1)]),
        ("loopback6", vec![v6("::1")]),
        ("linklocal", vec![v4(169, 254, 1, 1)]),
        ("linklocal6", vec![v6("fe80::1")]),
        ("unspecified", vec![v4(0, 0, 0, 0)]),
        ("broadcast", vec![v4(255, 255, 255, 255)]),
        ("multicast", vec![v4(224, 0, 0, 1)]),
        ("multicast6", vec![v6("ff02::1")]),
        ("unspecified6", vec![v6("::")]),
        ("mapped", vec![v6("::ffff:10.0.0.1")]),
        ("mappedloop", vec![v6("::ffff:127.0.0.1")]),
        ("mixed", vec![v4(93, 184, 216, 34), v4(10, 0, 0, 1)]),
        ("empty", vec![]),
        ("receiver", vec![v4(127, 0, 0, 1)]),
    ];
    entries.into_iter().map(|(label, addrs)| (format!("{label}.fanout.test"), addrs)).collect()
}

/// Lowercase, without a trailing dot.
fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// UDP on an ephemeral port, then TCP on the same port; a few tries in case
/// another process holds that TCP port.
async fn bind_pair() -> anyhow::Result<(UdpSocket, TcpListener)> {
    let mut last_err = None;
    for _ in 0..20 {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.context("bind udp")?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last_err = Some(e),
        }
    }
    Err(anyhow::Error::from(last_err.expect("at least one try")).context("bind tcp on the udp port"))
}

async fn serve_udp(socket: UdpSocket, zone: Zone) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        if let Some(reply) = answer(&buf[..len], &zone) {
            let _ = socket.send_to(&reply, peer).await;
        }
    }
}

async fn serve_tcp(listener: TcpListener, zone: Zone) {
    // Dropping the JoinSet (when this task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        connections.spawn(serve_tcp_connection(stream, zone.clone()));
        while connections.try_join_next().is_some() {}
    }
}

/// RFC 1035 4.2.2: each message is prefixed by its two-byte length.
async fn serve_tcp_connection(mut stream: TcpStream, zone: Zone) {
    loop {
        let Ok(len) = stream.read_u16().await else { return };
        let mut buf = vec![0u8; usize::from(len)];
        if stream.read_exact(&mut buf).await.is_err() {
            return;
        }
        let Some(reply) = answer(&buf, &zone) else { return };
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        if stream.write_u16(reply_len).await.is_err() || stream.write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// The wire reply to one wire query, or None for an undecodable packet.
fn answer(packet: &[u8], zone: &Zone) -> Option<Vec<u8>> {
    let request = Message::from_vec(packet).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    reply.queries = request.queries.clone();

    let code = match (request.metadata.op_code, request.queries.as_slice()) {
        (OpCode::Query, [query]) => {
            let addrs = zone.read().expect("zone lock").get(&normalize(&query.name().to_ascii())).cloned();
            match addrs {
                None => ResponseCode::NXDomain,
                Some(addrs) => {
                    for ip in addrs {
                        let wanted = match ip {
                            IpAddr::V4(_) => RecordType::A,
                            IpAddr::V6(_) => RecordType::AAAA,
                        };
                        if query.query_type() == wanted {
                            reply.add_answer(Record::from_rdata(query.name().clone(), 0, RData::from(ip)));
                        }
                    }
                    ResponseCode::NoError
                }
            }
        }
        (OpCode::Query, _) => ResponseCode::FormErr,
        _ => ResponseCode::NotImp,
    };
    reply.metadata.response_code = code;
    reply.to_vec().ok()
}
