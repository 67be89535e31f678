//! A real DNS server on 127.0.0.1 for end-to-end tests of webhook resolution
//! (PUSH-256). It answers A and AAAA queries from an in-memory zone over UDP
//! and TCP on the same port: NOERROR with the records, NOERROR with an empty
//! answer for a zone name without records of the asked type, NXDOMAIN for a
//! name outside the zone. Records carry TTL 0, so a change made with
//! `TestDns::set` (a rebinding host) is seen by the next lookup.
//!
//! A name can also be made to fail, for the lookups that say nothing about
//! the host: `TestDns::fail` answers it with SERVFAIL, and
//! `TestDns::hang` never answers it at all (UDP: no reply; TCP: the connection
//! stays open and silent), so the client's lookup times out. Both apply to
//! every query type of the name until `set` gives it addresses again or
//! `remove` takes it out of the zone. `TestDns::queries` counts the queries
//! a name received, answered or not.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::{JoinHandle, JoinSet};

/// How the server answers one name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// NOERROR with the records of the asked type (none: an empty answer).
    Records(Vec<IpAddr>),
    /// SERVFAIL, whatever the type.
    ServFail,
    /// No answer at all.
    Hang,
}

struct ZoneData {
    names: HashMap<String, Entry>,
    /// Queries received per name (normalized), answered or not.
    queries: HashMap<String, usize>,
}

type Zone = Arc<RwLock<ZoneData>>;

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
    let names = map.into_iter().map(|(name, addrs)| (name, Entry::Records(addrs))).collect();
    let zone: Zone = Arc::new(RwLock::new(ZoneData { names, queries: HashMap::new() }));
    let (udp, tcp) = bind_pair().await?;
    let addr = udp.local_addr()?;
    let tasks = vec![tokio::spawn(serve_udp(udp, zone.clone())), tokio::spawn(serve_tcp(tcp, zone.clone()))];
    Ok(TestDns { addr, zone, tasks })
}

impl TestDns {
    /// Replace a name's addresses (an empty list keeps the name with no
    /// records, so it answers NOERROR with no answer). Ends a `fail` or `hang`.
    pub fn set(&self, name: &str, addrs: Vec<IpAddr>) {
        self.put(name, Entry::Records(addrs));
    }

    /// Remove a name, so it answers NXDOMAIN. Ends a `fail` or `hang`.
    pub fn remove(&self, name: &str) {
        self.zone.write().expect("zone lock").names.remove(&normalize(name));
    }

    /// Answer every query for `name` with SERVFAIL (a resolver that cannot
    /// answer now), until `set` or `remove`. Its addresses are forgotten.
    pub fn fail(&self, name: &str) {
        self.put(name, Entry::ServFail);
    }

    /// Never answer a query for `name`, so a lookup of it times out, until
    /// `set` or `remove`. Its addresses are forgotten.
    pub fn hang(&self, name: &str) {
        self.put(name, Entry::Hang);
    }

    /// Queries received for `name` so far (every type, answered or not).
    pub fn queries(&self, name: &str) -> usize {
        self.zone.read().expect("zone lock").queries.get(&normalize(name)).copied().unwrap_or(0)
    }

    fn put(&self, name: &str, entry: Entry) {
        self.zone.write().expect("zone lock").names.insert(normalize(name), entry);
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
/// blocked address class, one per reserved class beyond the spec's table
/// ([`RESERVED_NAMES`]), `nat64public` (a DNS64 answer for the
/// public address), `mixed`, `empty`, and `receiver` (127.0.0.1, for a real
/// receiver under allow_private_addresses).
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
        ("ietf", vec![v4(192, 0, 0, 8)]),
        ("testnet1", vec![v4(192, 0, 2, 1)]),
        ("testnet2", vec![v4(198, 51, 100, 1)]),
        ("testnet3", vec![v4(203, 0, 113, 1)]),
        ("benchmark", vec![v4(198, 18, 0, 1)]),
        ("classe", vec![v4(240, 0, 0, 1)]),
        ("v4compat", vec![v6("::93.184.216.34")]),
        ("nat64reserved", vec![v6("64:ff9b::198.18.0.1")]),
        ("nat64local", vec![v6("64:ff9b:1::5db8:d822")]),
        ("sixtofour", vec![v6("2002:5db8:d822::1")]),
        ("teredo", vec![v6("2001:0:4136:e378:8000:63bf:3fff:fdd2")]),
        ("doc6", vec![v6("2001:db8::1")]),
        ("nat64private", vec![v6("64:ff9b::10.0.0.1")]),
        ("nat64public", vec![v6("64:ff9b::93.184.216.34")]),
        ("mixed", vec![v4(93, 184, 216, 34), v4(10, 0, 0, 1)]),
        ("empty", vec![]),
        ("receiver", vec![v4(127, 0, 0, 1)]),
    ];
    entries.into_iter().map(|(label, addrs)| (format!("{label}.fanout.test"), addrs)).collect()
}

/// The labels of `standard_zone` (under `fanout.test`) whose address is in a
/// reserved class beyond spec 000's table: refused while
/// `allow_reserved_addresses` is false, whatever `allow_private_addresses`
/// says. Each pairs with one address of its class. The 6to4, v4compat and
/// nat64local addresses embed the public 93.184.216.34: those prefixes are
/// blocked whole.
pub const RESERVED_NAMES: &[&str] = &[
    "ietf",
    "testnet1",
    "testnet2",
    "testnet3",
    "benchmark",
    "classe",
    "v4compat",
    "nat64reserved",
    "nat64local",
    "sixtofour",
    "teredo",
    "doc6",
];

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
        if let Reply::Message(reply) = answer(&buf[..len], &zone) {
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
        let reply = match answer(&buf, &zone) {
            Reply::Message(reply) => reply,
            // Read the next query; this one gets no answer.
            Reply::Silence => continue,
            Reply::Undecodable => return,
        };
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        if stream.write_u16(reply_len).await.is_err() || stream.write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// What to do with one query.
enum Reply {
    /// Send this wire message.
    Message(Vec<u8>),
    /// Send nothing (a hanging name); on TCP keep the connection.
    Silence,
    /// Not a query this server can read: drop it (TCP: close).
    Undecodable,
}

/// The reply to one wire query.
fn answer(packet: &[u8], zone: &Zone) -> Reply {
    let Ok(request) = Message::from_vec(packet) else {
        return Reply::Undecodable;
    };
    if request.metadata.message_type != MessageType::Query {
        return Reply::Undecodable;
    }
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    reply.queries = request.queries.clone();

    let code = match (request.metadata.op_code, request.queries.as_slice()) {
        (OpCode::Query, [query]) => {
            let name = normalize(&query.name().to_ascii());
            let entry = {
                let mut zone = zone.write().expect("zone lock");
                *zone.queries.entry(name.clone()).or_default() += 1;
                zone.names.get(&name).cloned()
            };
            match entry {
                None => ResponseCode::NXDomain,
                Some(Entry::ServFail) => ResponseCode::ServFail,
                Some(Entry::Hang) => return Reply::Silence,
                Some(Entry::Records(addrs)) => {
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
    match reply.to_vec() {
        Ok(wire) => Reply::Message(wire),
        Err(_) => Reply::Undecodable,
    }
}
