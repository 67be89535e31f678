//! PUSH-256 at registration: scheme, userinfo, signing-key length, every
//! blocked address class by DNS name and as an IP literal, hosts that resolve
//! to nothing, allowed_domains matching, and allow_private_addresses; and the
//! reserved classes beyond the spec's table at registration
//! and at send, with allow_reserved_addresses.
//!
//! Registration only resolves a host; the registration tests never subscribe
//! a recipient or publish, so nothing is ever sent to any of these addresses.
//! The send test only ever offers a reserved address next to the loopback
//! receiver (see there).

use std::net::IpAddr;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_tests::client::Recipient;
use fanout_tests::dns::{self, TestDns};
use fanout_tests::{EngineConfig, Fanout};
use tonic::Code;

use crate::admission::{Check, Client};
use crate::common::{DELIVERY_WAIT, metric, publish, wait_for_metric, webhook_setup};
use fanout_tests::client::{envelope, group_topic, subscription};

const KEY: [u8; 32] = [0x5a; 32];

/// Every name of `dns::standard_zone` whose addresses fall in the blocked table.
const BLOCKED_NAMES: &[&str] = &[
    "private10",
    "private172",
    "private192",
    "ula",
    "shared",
    "sitelocal",
    "loopback",
    "loopback6",
    "linklocal",
    "linklocal6",
    "unspecified",
    "broadcast",
    "multicast",
    "multicast6",
    "unspecified6",
    "mapped",
    "mappedloop",
    "mixed",
    "receiver",
    // NAT64: judged as its IPv4 address, 10.0.0.1.
    "nat64private",
];

/// Extra names at the edges of the blocked classes (all blocked).
const BLOCKED_EDGES: &[(&str, &str)] = &[
    ("edge-private172-top.fanout.test", "172.31.255.255"),
    ("edge-private10-top.fanout.test", "10.255.255.255"),
    ("edge-private192-top.fanout.test", "192.168.255.255"),
    ("edge-shared-top.fanout.test", "100.127.255.255"),
    ("edge-loopback-other.fanout.test", "127.1.2.3"),
    ("edge-linklocal-top.fanout.test", "169.254.255.255"),
    ("edge-multicast-top.fanout.test", "239.255.255.255"),
    ("edge-ula-fd.fanout.test", "fdff:ffff::1"),
    ("edge-sitelocal-top.fanout.test", "feff::1"),
    ("edge-linklocal6-top.fanout.test", "febf::1"),
    ("edge-multicast6-top.fanout.test", "ffff::1"),
    ("edge-mapped-linklocal.fanout.test", "::ffff:169.254.0.1"),
    ("edge-mapped-shared.fanout.test", "::ffff:100.64.0.1"),
    ("edge-mapped-multicast.fanout.test", "::ffff:224.0.0.1"),
    ("edge-mapped-unspecified.fanout.test", "::ffff:0.0.0.0"),
];

/// Names just outside the blocked classes (public, so accepted). Registration
/// only: nothing ever connects to them.
const PUBLIC_EDGES: &[(&str, &str)] = &[
    ("edge-after-private172.fanout.test", "172.32.0.1"),
    ("edge-before-private172.fanout.test", "172.15.255.255"),
    ("edge-after-shared.fanout.test", "100.128.0.1"),
    ("edge-before-shared.fanout.test", "100.63.255.255"),
    ("edge-after-private10.fanout.test", "11.0.0.1"),
    ("edge-after-private192.fanout.test", "192.169.0.1"),
    ("edge-after-linklocal.fanout.test", "169.255.0.1"),
    ("edge-before-multicast.fanout.test", "223.255.255.254"),
    ("edge-public6.fanout.test", "2001:4860:4860::8888"),
    ("edge-before-ula.fanout.test", "fbff::1"),
    // Just outside the reserved classes beyond the spec's table.
    ("edge-before-ietf.fanout.test", "191.255.255.255"),
    ("edge-after-testnet1.fanout.test", "192.0.3.1"),
    ("edge-before-benchmark.fanout.test", "198.17.255.255"),
    ("edge-after-benchmark.fanout.test", "198.20.0.1"),
    ("edge-after-testnet3.fanout.test", "203.0.114.1"),
    ("edge-after-teredo.fanout.test", "2001:1::1"),
    ("edge-after-doc6.fanout.test", "2001:db9::1"),
    ("edge-after-6to4.fanout.test", "2003::1"),
    // A DNS64 answer for a public IPv4 address.
    ("edge-nat64-public.fanout.test", "64:ff9b::93.184.216.34"),
];

/// One IP literal per reserved class beyond the spec's table, as a URL host.
const RESERVED_LITERALS: &[&str] = &[
    "192.0.0.8",
    "192.0.2.1",
    "198.51.100.1",
    "203.0.113.255",
    "198.18.0.1",
    "198.19.255.255",
    "240.0.0.1",
    "[::93.184.216.34]",
    "[64:ff9b::198.18.0.1]",
    "[64:ff9b:1::5db8:d822]",
    "[2002:5db8:d822::1]",
    "[2001::1]",
    "[2001:db8::1]",
];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("valid IP")
}

async fn zone_with(extra: &[(&str, &str)]) -> TestDns {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    for (name, addr) in extra {
        dns.set(name, vec![ip(addr)]);
    }
    dns
}

/// Registers a fresh recipient at `url`; on an expected failure also checks
/// that the recipient was not created.
async fn register(ck: &mut Check, c: &mut Client, what: &str, url: &str, key: &[u8], want: Code) {
    let r = Recipient::random();
    let got = ck.code(
        &format!("{what}: Register {url:?} (key {} bytes)", key.len()),
        c.register(r.register_http(url, key)).await,
        want,
    );
    if want != Code::Ok {
        ck.absent(c, &r, &format!("{what}: refused {url:?}")).await;
    } else if let Some(state) = got {
        ck.eq(&format!("{what}: {url:?} channel"), state.channel, pb::Channel::Http as i32);
        ck.eq(&format!("{what}: {url:?} topic_count"), state.topic_count, 0);
    }
}

/// The value of an unlabelled counter in a Prometheus text body.
fn counter(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

async fn refused_counter(fanout: &Fanout) -> Option<f64> {
    let (_, body) = fanout.http_get("/metrics").await.ok()?;
    counter(&body, "fanout_webhook_refused_register_total")
}

#[tokio::test]
async fn registration_refuses_unsafe_webhook_destinations() {
    let mut edges: Vec<(&str, &str)> = BLOCKED_EDGES.to_vec();
    edges.extend_from_slice(PUBLIC_EDGES);
    let dns = zone_with(&edges).await;
    // A public address plus a private IPv6 one: blocked as a whole.
    dns.set("mixed6.fanout.test", vec![ip("93.184.216.34"), ip("fc00::1")]);
    let fanout = Fanout::start(EngineConfig {
        allow_private_addresses: false,
        dns_server: Some(dns.addr),
        ..EngineConfig::default()
    })
    .await
    .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let refused_before = refused_counter(&fanout).await;
    let ia = Code::InvalidArgument;

    // The one good destination, with every signing-key length at the edges.
    let good = "https://public.fanout.test/hook";
    register(&mut ck, &mut c, "public name", good, &KEY, Code::Ok).await;
    register(&mut ck, &mut c, "16-byte key", good, &[1; 16], Code::Ok).await;
    register(&mut ck, &mut c, "64-byte key", good, &[1; 64], Code::Ok).await;
    register(&mut ck, &mut c, "15-byte key", good, &[1; 15], ia).await;
    register(&mut ck, &mut c, "65-byte key", good, &[1; 65], ia).await;
    register(&mut ck, &mut c, "empty key", good, &[], ia).await;
    register(&mut ck, &mut c, "public name with a port", "https://public.fanout.test:8443/hook?x=1", &KEY, Code::Ok)
        .await;
    register(&mut ck, &mut c, "public IPv4 literal", "https://93.184.216.34/hook", &KEY, Code::Ok).await;
    register(
        &mut ck,
        &mut c,
        "public IPv6 literal",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
        &KEY,
        Code::Ok,
    )
    .await;
    register(
        &mut ck,
        &mut c,
        "IPv4-mapped public literal (not in the table)",
        "https://[::ffff:93.184.216.34]/hook",
        &KEY,
        Code::Ok,
    )
    .await;
    for (name, addr) in PUBLIC_EDGES {
        register(&mut ck, &mut c, &format!("public edge {addr}"), &format!("https://{name}/hook"), &KEY, Code::Ok)
            .await;
    }

    // Scheme and userinfo.
    for url in [
        "http://public.fanout.test/hook",
        "wss://public.fanout.test/hook",
        "ftp://public.fanout.test/hook",
        "https://user@public.fanout.test/hook",
        "https://user:pass@public.fanout.test/hook",
        "https://:pass@public.fanout.test/hook",
        "https://user:@public.fanout.test/hook",
        "https://",
        "https:///hook",
        "not a url",
        "public.fanout.test/hook",
    ] {
        register(&mut ck, &mut c, "scheme, userinfo or syntax", url, &KEY, ia).await;
    }

    // Every blocked class, by name, through the real DNS server.
    let mut blocked = 0.0;
    for label in BLOCKED_NAMES {
        register(&mut ck, &mut c, "blocked name", &format!("https://{label}.fanout.test/hook"), &KEY, ia).await;
        blocked += 1.0;
    }
    for (name, addr) in BLOCKED_EDGES {
        register(&mut ck, &mut c, &format!("blocked edge {addr}"), &format!("https://{name}/hook"), &KEY, ia).await;
        blocked += 1.0;
    }
    for label in dns::RESERVED_NAMES {
        register(&mut ck, &mut c, "reserved name", &format!("https://{label}.fanout.test/hook"), &KEY, ia).await;
        blocked += 1.0;
    }
    register(&mut ck, &mut c, "public A + private AAAA", "https://mixed6.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "blocked name with a trailing dot", "https://private10.fanout.test./hook", &KEY, ia)
        .await;
    register(&mut ck, &mut c, "blocked name in upper case", "https://LOOPBACK.Fanout.Test/hook", &KEY, ia).await;
    blocked += 3.0;

    // Every blocked class as an IP literal.
    for literal in [
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "[fc00::1]",
        "[fd12:3456::1]",
        "100.64.0.1",
        "100.127.255.255",
        "[fec0::1]",
        "127.0.0.1",
        "127.1.2.3",
        "[::1]",
        "169.254.1.1",
        "[fe80::1]",
        "0.0.0.0",
        "[::]",
        "255.255.255.255",
        "224.0.0.1",
        "239.255.255.255",
        "[ff02::1]",
        "[::ffff:10.0.0.1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:169.254.1.1]",
        "[::ffff:192.168.0.1]",
        "[::ffff:0.0.0.0]",
        // NAT64: judged as 10.0.0.1.
        "[64:ff9b::10.0.0.1]",
        // Other spellings of 127.0.0.1 that URL parsers normalise.
        "2130706433",
        "0x7f000001",
        "127.1",
        "0177.0.0.1",
    ]
    .into_iter()
    .chain(RESERVED_LITERALS.iter().copied())
    {
        register(&mut ck, &mut c, "blocked IP literal", &format!("https://{literal}/hook"), &KEY, ia).await;
        register(&mut ck, &mut c, "blocked IP literal with a port", &format!("https://{literal}:8443/hook"), &KEY, ia)
            .await;
        blocked += 2.0;
    }

    // Hosts that resolve to no address.
    register(&mut ck, &mut c, "name without records", "https://empty.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "unknown name (NXDOMAIN)", "https://nosuch.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "localhost", "https://localhost/hook", &KEY, ia).await;
    blocked += 3.0;

    // A stored recipient that tries to move to a blocked host keeps its registration.
    let r = Recipient::random();
    ck.ok("stored recipient at the public name", c.register(r.register_http(good, &KEY)).await);
    ck.code(
        "stored recipient re-registers at a blocked name",
        c.register(r.register_http("https://private10.fanout.test/hook", &KEY)).await,
        ia,
    );
    ck.state_is(&mut c, &r, "after a refused re-registration", 0, pb::Channel::Http).await;

    // The refusals are counted.
    let after = refused_counter(&fanout).await;
    match (refused_before, after) {
        (Some(b), Some(a)) => ck.truth(
            &format!("fanout_webhook_refused_register_total rose by at least {blocked} (before {b}, after {a})"),
            a - b >= blocked,
        ),
        _ => ck.failures.push(format!(
            "/metrics has no fanout_webhook_refused_register_total (before {refused_before:?}, after {after:?})"
        )),
    }

    ck.finish("PUSH-256, allow_private_addresses = false", &fanout.log());
}

#[tokio::test]
async fn allowed_domains_match_suffixes_and_exact_names() {
    let dns = zone_with(&[
        ("fanout.test", "93.184.216.34"),
        ("evilfanout.test", "93.184.216.34"),
        ("a.b.fanout.test", "93.184.216.34"),
        ("exact.example", "93.184.216.35"),
        ("sub.exact.example", "93.184.216.35"),
        ("notexact.example", "93.184.216.35"),
        ("exact.example.evil", "93.184.216.35"),
        ("public.fanout.test.evil.example", "93.184.216.35"),
    ])
    .await;
    let fanout = Fanout::start(EngineConfig {
        allow_private_addresses: false,
        dns_server: Some(dns.addr),
        allowed_domains: vec!["*.fanout.test".into(), "exact.example".into()],
        ..EngineConfig::default()
    })
    .await
    .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let ia = Code::InvalidArgument;

    for url in [
        "https://public.fanout.test/hook",
        "https://PUBLIC.Fanout.Test/hook",
        "https://a.b.fanout.test/hook",
        "https://exact.example/hook",
        "https://EXACT.Example/hook",
        "https://exact.example:8443/hook",
        "https://public.fanout.test:8443/hook",
    ] {
        register(&mut ck, &mut c, "allowed domain", url, &KEY, Code::Ok).await;
    }
    for url in [
        "https://fanout.test/hook",
        "https://evilfanout.test/hook",
        "https://sub.exact.example/hook",
        "https://notexact.example/hook",
        "https://exact.example.evil/hook",
        "https://public.fanout.test.evil.example/hook",
        "https://93.184.216.34/hook",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
    ] {
        register(&mut ck, &mut c, "host outside allowed_domains", url, &KEY, ia).await;
    }
    // A matching name must still pass the address and URL checks.
    register(&mut ck, &mut c, "allowed domain with a private address", "https://private10.fanout.test/hook", &KEY, ia)
        .await;
    register(&mut ck, &mut c, "allowed domain without records", "https://empty.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "allowed domain, http scheme", "http://public.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "allowed domain, userinfo", "https://u:p@public.fanout.test/hook", &KEY, ia).await;
    register(&mut ck, &mut c, "allowed domain, 15-byte key", "https://public.fanout.test/hook", &[1; 15], ia).await;

    ck.finish("PUSH-256, allowed_domains", &fanout.log());
}

#[tokio::test]
async fn allow_private_addresses_accepts_blocked_classes_only_there() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    let fanout = Fanout::start(EngineConfig {
        allow_private_addresses: true,
        dns_server: Some(dns.addr),
        ..EngineConfig::default()
    })
    .await
    .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let ia = Code::InvalidArgument;

    for url in [
        "https://private10.fanout.test/hook",
        "https://loopback.fanout.test/hook",
        "https://loopback6.fanout.test/hook",
        "https://mapped.fanout.test/hook",
        "https://receiver.fanout.test:8443/hook",
        "https://public.fanout.test/hook",
        "https://10.0.0.1/hook",
        "https://127.0.0.1:8443/hook",
        "https://[::1]/hook",
    ] {
        register(&mut ck, &mut c, "allow_private_addresses = true", url, &KEY, Code::Ok).await;
    }
    // Everything else of PUSH-256 still applies.
    for url in [
        "http://loopback.fanout.test/hook",
        "https://user:pass@loopback.fanout.test/hook",
        "https://empty.fanout.test/hook",
        "https://nosuch.fanout.test/hook",
    ] {
        register(&mut ck, &mut c, "allow_private_addresses = true, still refused", url, &KEY, ia).await;
    }
    register(
        &mut ck,
        &mut c,
        "allow_private_addresses = true, 15-byte key",
        "https://loopback.fanout.test/hook",
        &[1; 15],
        ia,
    )
    .await;
    register(
        &mut ck,
        &mut c,
        "allow_private_addresses = true, 65-byte key",
        "https://loopback.fanout.test/hook",
        &[1; 65],
        ia,
    )
    .await;

    ck.finish("PUSH-256, allow_private_addresses = true", &fanout.log());
}

/// The environment variable that lifts the reserved classes.
const ALLOW_RESERVED: &str = "FANOUT__ENGINE__CHANNELS__HTTP__ALLOW_RESERVED_ADDRESSES";

/// The reserved classes stay refused when the spec's table
/// is lifted (allow_private_addresses = true, as every test engine runs), at
/// Register and before every attempt.
///
/// At send, each reserved address is offered after 127.0.0.1, where the real
/// receiver listens: were the check missing, the engine would reuse its
/// pooled loopback connection or connect to the first address, so the push
/// would arrive there; no packet ever has to leave loopback to show it.
#[tokio::test]
async fn reserved_classes_are_refused_at_register_and_at_send() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    let setup = webhook_setup(EngineConfig { dns_server: Some(dns.addr), ..EngineConfig::default() }).await;
    let fanout = &setup.fanout;
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let ia = Code::InvalidArgument;

    // At Register: every reserved name and literal, though private addresses are allowed.
    for label in dns::RESERVED_NAMES {
        register(&mut ck, &mut c, "reserved name", &format!("https://{label}.fanout.test/hook"), &KEY, ia).await;
    }
    for literal in RESERVED_LITERALS {
        register(&mut ck, &mut c, "reserved IP literal", &format!("https://{literal}/hook"), &KEY, ia).await;
    }
    // The NAT64 address of a private one follows the spec's table, lifted here.
    register(
        &mut ck,
        &mut c,
        "NAT64 of 10.0.0.1, private allowed",
        "https://nat64private.fanout.test/hook",
        &KEY,
        Code::Ok,
    )
    .await;
    register(&mut ck, &mut c, "NAT64 of a public address", "https://nat64public.fanout.test/hook", &KEY, Code::Ok)
        .await;

    // At send: a recipient at the receiver, delivered once while its name
    // resolves to loopback only.
    let receiver = "receiver.fanout.test";
    let port = setup.receiver.addr().port();
    let r = Recipient::random();
    let topic = group_topic();
    setup.receiver.set_signing_key("/hook", KEY.to_vec());
    ck.ok("register the receiver", c.register(r.register_http(&format!("https://{receiver}:{port}/hook"), &KEY)).await);
    ck.ok("subscribe", c.update_subscriptions(r.update(vec![subscription(&topic)], vec![])).await);
    publish(fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    ck.eq("the first push arrives", setup.receiver.wait_for(1, DELIVERY_WAIT).await.len(), 1);

    let refused_series = "fanout_webhook_refused_send_total";
    let loopback: IpAddr = ip("127.0.0.1");
    for label in dns::RESERVED_NAMES {
        let reserved = standard_address(label);
        dns.set(receiver, vec![loopback, reserved]);
        let before = metric(fanout, refused_series).await.unwrap_or(0.0);
        publish(fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
        let after = wait_for_metric(fanout, refused_series, before + 1.0, DELIVERY_WAIT).await;
        ck.truth(&format!("{label} ({reserved}): the attempt is refused ({before} -> {after})"), after >= before + 1.0);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    ck.eq("requests the receiver got: only the first push", setup.receiver.received_count(), 1);

    // Back to loopback alone, the same recipient is served again.
    dns.set(receiver, vec![loopback]);
    publish(fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    ck.eq("a push after the name is safe again", setup.receiver.wait_for(2, DELIVERY_WAIT).await.len(), 2);

    ck.finish("reserved address classes", &fanout.log());
}

/// The one address `label` has in the standard zone.
pub(crate) fn standard_address(label: &str) -> IpAddr {
    let name = format!("{label}.fanout.test");
    let addrs = dns::standard_zone().into_iter().find(|(n, _)| *n == name).map(|(_, a)| a).unwrap_or_default();
    assert_eq!(addrs.len(), 1, "{name} has one address in the standard zone");
    addrs[0]
}

/// allow_reserved_addresses = true lifts the reserved classes and nothing
/// else: the spec's table stays the minimum.
#[tokio::test]
async fn allow_reserved_addresses_lifts_only_the_reserved_classes() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    let fanout = Fanout::start(EngineConfig {
        allow_private_addresses: false,
        dns_server: Some(dns.addr),
        env: vec![(ALLOW_RESERVED.into(), "true".into())],
        ..EngineConfig::default()
    })
    .await
    .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();

    for label in dns::RESERVED_NAMES {
        let url = format!("https://{label}.fanout.test/hook");
        register(&mut ck, &mut c, "reserved name, reserved allowed", &url, &KEY, Code::Ok).await;
    }
    for literal in RESERVED_LITERALS {
        let url = format!("https://{literal}/hook");
        register(&mut ck, &mut c, "reserved literal, reserved allowed", &url, &KEY, Code::Ok).await;
    }
    for label in BLOCKED_NAMES.iter().filter(|l| **l != "nat64private") {
        let url = format!("https://{label}.fanout.test/hook");
        register(&mut ck, &mut c, "spec table, reserved allowed", &url, &KEY, Code::InvalidArgument).await;
    }
    // Without the reserved rules, NAT64 is not decoded: the spec's table
    // alone does not list 64:ff9b::/96.
    register(&mut ck, &mut c, "NAT64 of 10.0.0.1", "https://nat64private.fanout.test/hook", &KEY, Code::Ok).await;

    ck.finish("allow_reserved_addresses = true", &fanout.log());
}
