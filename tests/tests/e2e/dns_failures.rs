//! DNS failures through the real test DNS server: a lookup
//! that fails (SERVFAIL) or never answers (timeout) says nothing about the
//! host, so Register answers `UNAVAILABLE` (retryable) and stores nothing,
//! and at send time the attempt is transient and retried until the name
//! resolves again: the push arrives, the recipient stays. "No such name",
//! "no address" and "a blocked address" are final and read the same.
//!
//! A timed-out lookup takes the resolver's whole bound (`LOOKUP_TIMEOUT`,
//! 5 s, in `engine/src/transport/destination/resolve.rs`; not configurable), so the
//! hanging cases cost about 5 s each.

use std::net::IpAddr;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::dns::{self, TestDns};
use fanout_tests::{EngineConfig, Fanout};
use tonic::Code;

use crate::admission::Check;
use crate::common::*;

/// The receiver's name in the standard zone; its certificate covers it.
const RECEIVER: &str = "receiver.fanout.test";
const REFUSED_REGISTER: &str = "fanout_webhook_refused_register_total";
const REFUSED_SEND: &str = "fanout_webhook_refused_send_total";
const TRANSIENT: &str = r#"fanout_attempts_total{channel="http",outcome="transient"}"#;
const DELIVERED: &str = r#"fanout_deliveries_total{channel="http",outcome="delivered"}"#;
/// A SERVFAIL lookup answers at once, a hanging one after 5 s.
const LOOKUP_WAIT: Duration = Duration::from_secs(12);

fn loopback() -> Vec<IpAddr> {
    vec!["127.0.0.1".parse().expect("an address")]
}

async fn engine_with(dns: &TestDns, config: EngineConfig) -> WebhookSetup {
    webhook_setup(EngineConfig { dns_server: Some(dns.addr), ..config }).await
}

/// No status message may name the host, the URL or its port (PUSH-254).
fn check_no_host(ck: &mut Check, what: &str, message: &str, port: u16) {
    for secret in ["fanout.test", "receiver", "nosuch", "private10", &port.to_string()] {
        ck.truth(&format!("{what}: the message {message:?} names {secret:?}"), !message.contains(secret));
    }
}

#[tokio::test]
async fn a_failing_lookup_at_register_is_unavailable_and_changes_nothing() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    let setup = engine_with(&dns, EngineConfig::default()).await;
    let port = setup.receiver.addr().port();
    let url = |path: &str| format!("https://{RECEIVER}:{port}{path}");
    let mut c = setup.fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let (k1, k2) = ([0x41u8; 32], [0x42u8; 32]);

    // Stored while the name resolves, subscribed to one topic.
    let kept = Recipient::random();
    let topic = group_topic();
    setup.receiver.set_signing_key("/kept", k1.to_vec());
    ck.ok("register while the name resolves", c.register(kept.register_http(&url("/kept"), &k1)).await);
    ck.ok("subscribe", c.update_subscriptions(kept.update(vec![subscription(&topic)], vec![])).await);
    let refused_before = metric(&setup.fanout, REFUSED_REGISTER).await;

    for (failure, make_it_fail) in [("SERVFAIL", TestDns::fail as fn(&TestDns, &str)), ("timeout", TestDns::hang)] {
        make_it_fail(&dns, RECEIVER);
        let asked = dns.queries(RECEIVER);
        let fresh = Recipient::random();
        // Both at once: a hanging lookup takes the resolver's whole bound.
        let mut c2 = setup.fanout.notifications().await.expect("client");
        let (new, moved) = tokio::join!(
            c.register(fresh.register_http(&url("/new"), &k1)),
            c2.register(kept.register_http(&url("/moved"), &k2)),
        );
        ck.truth(&format!("{failure}: the engine asked the DNS server"), dns.queries(RECEIVER) > asked);
        for (what, result) in [("a new recipient", new), ("the stored recipient moving", moved)] {
            let what = format!("{failure}: Register of {what}");
            if let Err(status) = &result {
                check_no_host(&mut ck, &what, status.message(), port);
            }
            ck.code(&what, result, Code::Unavailable);
        }
        ck.absent(&mut c, &fresh, &format!("{failure}: the new recipient")).await;
        ck.state_is(&mut c, &kept, &format!("{failure}: the stored recipient"), 1, pb::Channel::Http).await;
    }
    // A lookup that failed is not a refused destination.
    ck.eq("fanout_webhook_refused_register_total", metric(&setup.fanout, REFUSED_REGISTER).await, refused_before);

    // The name resolves again: the same Register is accepted now...
    dns.set(RECEIVER, loopback());
    let later = Recipient::random();
    ck.ok("Register once the name resolves", c.register(later.register_http(&url("/new"), &k1)).await);
    // ...and the stored recipient still has its old URL and key: a push goes
    // to /kept, signed with k1, and nothing to /moved.
    publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await;
    let got = setup.receiver.wait_for(1, DELIVERY_WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got: Vec<_> = got.iter().map(|q| (q.path.clone(), q.signature_valid)).collect();
    ck.eq(
        "deliveries after the failed moves (path, signature valid under k1)",
        got,
        vec![("/kept".into(), Some(true))],
    );
    ck.eq("requests in all", setup.receiver.received_count(), 1);

    ck.finish("a failing lookup at Register", &setup.fanout.log());
}

#[tokio::test]
async fn no_name_no_address_and_a_blocked_address_read_the_same() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    let fanout = Fanout::start(EngineConfig {
        allow_private_addresses: false,
        dns_server: Some(dns.addr),
        ..EngineConfig::default()
    })
    .await
    .expect("start fanout");
    let mut c = fanout.notifications().await.expect("client");
    let mut ck = Check::default();
    let key = [0x43u8; 32];

    let mut messages: Vec<(&str, String)> = Vec::new();
    for (what, url) in [
        ("no such name (NXDOMAIN)", "https://nosuch.fanout.test/hook"),
        ("a name without records", "https://empty.fanout.test/hook"),
        ("a name of a private address", "https://private10.fanout.test/hook"),
        ("a name of a loopback address", "https://loopback6.fanout.test/hook"),
        ("a name of a public and a private address", "https://mixed.fanout.test/hook"),
        ("a private IP literal", "https://10.0.0.1/hook"),
    ] {
        let r = Recipient::random();
        let result = c.register(r.register_http(url, &key)).await;
        if let Err(status) = &result {
            messages.push((what, status.message().to_owned()));
            check_no_host(&mut ck, what, status.message(), 443);
        }
        ck.code(what, result, Code::InvalidArgument);
        ck.absent(&mut c, &r, what).await;
    }
    let first = messages.first().map(|(_, m)| m.clone()).unwrap_or_default();
    for (what, message) in &messages {
        ck.eq(&format!("the refusal of {what} reads as the one of no such name"), message, &first);
    }

    // A failing lookup is another answer (try again), and names nothing either.
    dns.fail("public.fanout.test");
    let r = Recipient::random();
    let result = c.register(r.register_http("https://public.fanout.test/hook", &key)).await;
    if let Err(status) = &result {
        check_no_host(&mut ck, "SERVFAIL", status.message(), 443);
        ck.truth("SERVFAIL reads differently from a final refusal", status.message() != first);
    }
    ck.code("SERVFAIL", result, Code::Unavailable);
    ck.absent(&mut c, &r, "SERVFAIL").await;

    ck.finish("refusal messages", &fanout.log());
}

#[tokio::test]
async fn a_failing_lookup_at_send_time_is_retried_and_nothing_is_lost() {
    let dns = dns::start(dns::standard_zone()).await.expect("dns");
    // Ten attempts, so the failure can last a few retries (1 s apart) before
    // the name comes back; with the default three it would be a race.
    let config =
        EngineConfig { env: vec![("FANOUT__ENGINE__MAX_ATTEMPTS".into(), "10".into())], ..EngineConfig::default() };
    let setup = engine_with(&dns, config).await;
    let port = setup.receiver.addr().port();
    let key = [0x44u8; 32];
    let r = Recipient::random();
    let topic = group_topic();
    setup.receiver.set_signing_key("/hook", key.to_vec());
    let mut c = setup.fanout.notifications().await.expect("client");
    c.register(r.register_http(&format!("https://{RECEIVER}:{port}/hook"), &key)).await.expect("register");
    c.update_subscriptions(r.update(vec![subscription(&topic)], vec![])).await.expect("subscribe");
    let windows_before = metric(&setup.fanout, "fanout_windows_total").await.unwrap_or(0.0);

    let mut delivered = 0;
    for (failure, make_it_fail, retried) in
        [("SERVFAIL", TestDns::fail as fn(&TestDns, &str), 2.0), ("timeout", TestDns::hang, 1.0)]
    {
        make_it_fail(&dns, RECEIVER);
        let transient_before = metric(&setup.fanout, TRANSIENT).await.unwrap_or(0.0);
        let seq =
            sequence_id(&publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true)]).await[0]);

        // Transient attempts (a SERVFAIL answers at once, so wait for a retry
        // too), and nothing sent.
        let transient = wait_for_metric(&setup.fanout, TRANSIENT, transient_before + retried, LOOKUP_WAIT).await;
        assert!(
            transient >= transient_before + retried,
            "{failure}: {transient} transient attempts, {transient_before} before; engine log:\n{}",
            setup.fanout.log_tail(40)
        );
        assert_eq!(setup.receiver.received_count(), delivered, "{failure}: nothing is sent while the lookup fails");

        // The name resolves again: the retry delivers the push.
        dns.set(RECEIVER, loopback());
        delivered += 1;
        let got = setup.receiver.wait_for(delivered, DELIVERY_WAIT).await;
        assert_eq!(
            got.len(),
            delivered,
            "{failure}: the push arrives once the name resolves; log:\n{}",
            setup.fanout.log_tail(40)
        );
        let last = &got[delivered - 1];
        assert_eq!(last.signature_valid, Some(true), "{failure}");
        let body = last.json().expect("a JSON body");
        assert_eq!(body["sequence_id"], seq.to_string(), "{failure}: the push of the envelope published while failing");
        assert!(still_registered(&setup.fanout, &r).await, "{failure}: the recipient is kept");
    }

    // Every push delivered once, none refused, exhausted or rejected, nobody
    // deleted; the checkpoint moved past both envelopes.
    let delivered_total = wait_for_metric(&setup.fanout, DELIVERED, 2.0, DELIVERY_WAIT).await;
    assert_eq!(delivered_total, 2.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(setup.receiver.received_count(), 2, "no repeats");
    assert_eq!(metric(&setup.fanout, REFUSED_SEND).await, Some(0.0), "a failed lookup is not a refused destination");
    for outcome in ["exhausted", "rejected", "terminal"] {
        let series = format!(r#"fanout_deliveries_total{{channel="http",outcome="{outcome}"}}"#);
        assert_eq!(metric(&setup.fanout, &series).await.unwrap_or(0.0), 0.0, "{series}");
    }
    let deleted = metric(&setup.fanout, r#"fanout_recipients_deleted_total{reason="terminal"}"#).await;
    assert_eq!(deleted.unwrap_or(0.0), 0.0, "no recipient deleted");
    let windows = wait_for_metric(&setup.fanout, "fanout_windows_total", windows_before + 2.0, DELIVERY_WAIT).await;
    assert!(windows >= windows_before + 2.0, "windows completed: {windows}, {windows_before} before");
}
