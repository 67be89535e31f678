//! The test DNS server answers a real resolver over UDP and TCP.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use fanout_tests::dns;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError, NoRecords};
use hickory_resolver::proto::op::ResponseCode;

fn resolver(addr: SocketAddr, udp: bool, tcp: bool) -> TokioResolver {
    resolver_with_timeout(addr, udp, tcp, Duration::from_secs(2))
}

/// One attempt per lookup, each exchange bounded by `timeout`.
fn resolver_with_timeout(addr: SocketAddr, udp: bool, tcp: bool, timeout: Duration) -> TokioResolver {
    let mut connections = Vec::new();
    if udp {
        let mut c = ConnectionConfig::udp();
        c.port = addr.port();
        connections.push(c);
    }
    if tcp {
        let mut c = ConnectionConfig::tcp();
        c.port = addr.port();
        connections.push(c);
    }
    let config = ResolverConfig::from_name_servers(vec![NameServerConfig::new(addr.ip(), true, connections)]);
    let mut builder = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.timeout = timeout;
    opts.attempts = 1;
    builder.build().expect("resolver")
}

async fn lookup(r: &TokioResolver, name: &str) -> Result<Vec<IpAddr>, NetError> {
    let mut addrs: Vec<IpAddr> = r.lookup_ip(name).await?.iter().collect();
    addrs.sort();
    Ok(addrs)
}

fn response_code(err: &NetError) -> Option<ResponseCode> {
    match err {
        NetError::Dns(DnsError::NoRecordsFound(NoRecords { response_code, .. })) => Some(*response_code),
        _ => None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn answers_public_empty_and_unknown_names() {
    let server = dns::start(dns::standard_zone()).await.unwrap();
    assert!(server.addr.ip().is_loopback());
    for (udp, tcp) in [(true, true), (false, true), (true, false)] {
        let r = resolver(server.addr, udp, tcp);

        let public = lookup(&r, "public.fanout.test.").await.unwrap();
        assert_eq!(public, vec![ip("93.184.216.34"), ip("2606:2800:220:1:248:1893:25c8:1946")]);
        // Case-insensitive, with or without the trailing dot.
        assert_eq!(lookup(&r, "PUBLIC.Fanout.Test").await.unwrap(), public);

        let mixed = lookup(&r, "mixed.fanout.test.").await.unwrap();
        assert_eq!(mixed, vec![ip("10.0.0.1"), ip("93.184.216.34")]);
        assert_eq!(lookup(&r, "mappedloop.fanout.test.").await.unwrap(), vec![ip("::ffff:127.0.0.1")]);

        let empty = lookup(&r, "empty.fanout.test.").await.unwrap_err();
        assert_eq!(response_code(&empty), Some(ResponseCode::NoError), "{empty}");

        let unknown = lookup(&r, "nowhere.fanout.test.").await.unwrap_err();
        assert_eq!(response_code(&unknown), Some(ResponseCode::NXDomain), "{unknown}");
        assert!(unknown.is_nx_domain());
    }
}

#[tokio::test]
async fn set_rebinds_a_name() {
    let server = dns::start(dns::standard_zone()).await.unwrap();
    let r = resolver(server.addr, true, true);
    assert_eq!(lookup(&r, "receiver.fanout.test.").await.unwrap(), vec![ip("127.0.0.1")]);
    // TTL 0: the next lookup sees the change.
    server.set("Receiver.fanout.test.", vec![ip("10.9.9.9")]);
    assert_eq!(lookup(&r, "receiver.fanout.test.").await.unwrap(), vec![ip("10.9.9.9")]);
    server.remove("receiver.fanout.test");
    assert!(lookup(&r, "receiver.fanout.test.").await.unwrap_err().is_nx_domain());
}

#[tokio::test]
async fn fail_answers_servfail_and_hang_never_answers_until_set() {
    let server = dns::start(dns::standard_zone()).await.unwrap();
    for (udp, tcp) in [(true, false), (false, true)] {
        let r = resolver_with_timeout(server.addr, udp, tcp, Duration::from_millis(300));
        let name = "receiver.fanout.test.";

        server.fail(name);
        let failed = lookup(&r, name).await.unwrap_err();
        assert!(
            matches!(failed, NetError::Dns(DnsError::ResponseCode(ResponseCode::ServFail))),
            "udp {udp}, tcp {tcp}: {failed:?}"
        );

        server.hang("Receiver.Fanout.Test");
        let before = server.queries(name);
        let started = std::time::Instant::now();
        let hung = lookup(&r, name).await.unwrap_err();
        assert!(matches!(hung, NetError::Timeout), "udp {udp}, tcp {tcp}: {hung:?}");
        assert!(started.elapsed() >= Duration::from_millis(300), "the answer came before the timeout");
        assert!(server.queries(name) > before, "the hanging name was asked");

        // `set` ends either, and the server (and a TCP connection) still answers.
        server.set(name, vec![ip("127.0.0.1")]);
        assert_eq!(lookup(&r, name).await.unwrap(), vec![ip("127.0.0.1")], "udp {udp}, tcp {tcp}");
        // Other names were never affected.
        assert!(lookup(&r, "public.fanout.test.").await.is_ok());
    }
}

#[tokio::test]
async fn drop_stops_the_server() {
    let server = dns::start(vec![("a.test".to_owned(), vec![ip("93.184.216.34")])]).await.unwrap();
    let addr = server.addr;
    drop(server);
    // Once the aborted tasks are gone, the TCP port is free again.
    let mut freed = false;
    for _ in 0..50 {
        if tokio::net::TcpListener::bind(addr).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the listener was not closed");
}
