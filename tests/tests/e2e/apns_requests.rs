//! APNs requests as an independent APNs server sees them: the real
//! engine against the mock APNs, which refuses what Apple refuses, among it
//! an `apns-collapse-id` over 64 bytes (400 BadCollapseId) and an
//! `apns-expiration` that is not Unix seconds (400 BadExpirationDate).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use fanout_proto::v1 as pb;
use fanout_tests::client::{Recipient, envelope, subscription};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::common::{ApnsSetup, DELIVERY_WAIT, apns_setup, publish, sequence_id, wait_for_metric};

/// A group topic whose identifier is `identifier_len` random bytes.
fn topic(identifier_len: usize) -> Vec<u8> {
    let mut t = vec![0x00; 1 + identifier_len];
    rand::rng().fill_bytes(&mut t[1..]);
    t
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A topic with a 64-byte identifier (TOPIC-001's longest) is delivered over
/// APNs: its collapse id is the documented stand-in, the same for every push
/// and recipient of the topic; a 47-byte identifier (base64 of exactly 64
/// bytes) keeps PUSH-259's value. Every request carries `apns-expiration` =
/// the configured `expiration_seconds` after it was sent.
#[tokio::test]
async fn long_topics_are_delivered_with_the_configured_expiration() {
    let ApnsSetup { fanout, mock, _dir } = apns_setup("expiration_seconds = 7200").await;
    let (long, edge) = (topic(64), topic(47));
    let (a, b) = (Recipient::random(), Recipient::random());
    let mut client = fanout.notifications().await.expect("client");
    for (r, token, topics) in [(&a, "aa01", vec![&long, &edge]), (&b, "bb02", vec![&long])] {
        let apns = pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: token.into() });
        client.register(r.register(apns)).await.expect("register");
        let adds = topics.iter().map(|t| subscription(t)).collect();
        client.update_subscriptions(r.update(adds, vec![])).await.expect("subscribe");
    }
    let before = unix_now();
    let envelopes = [&long, &long, &edge].map(|t| envelope(t, pb::EnvelopeKind::Application, true));
    let results = publish(&fanout, envelopes.to_vec()).await;
    let seqs: Vec<u64> = results.iter().map(sequence_id).collect();

    // 2 pushes × 2 recipients on the long topic, 1 on the edge topic.
    let got = mock.wait_for(5, DELIVERY_WAIT).await;
    assert_eq!(got.len(), 5, "requests: {got:#?}\nlog:\n{}", fanout.log());
    let delivered = wait_for_metric(
        &fanout,
        "fanout_deliveries_total{channel=\"apns\",outcome=\"delivered\"}",
        5.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(delivered, 5.0);

    let spec = |t: &[u8]| STANDARD.encode(t);
    let stand_in = {
        let mut h = Sha256::new();
        h.update(b"fanout/apns-collapse-id/v1\0");
        h.update(spec(&long).as_bytes());
        format!("~{}", STANDARD.encode(h.finalize()))
    };
    assert_eq!((spec(&long).len(), spec(&edge).len(), stand_in.len()), (88, 64, 45));
    for r in &got {
        assert_eq!(r.status_sent, 200, "the mock accepted {r:?}");
        assert_eq!(r.auth_valid, Some(true));
        let body = r.json().expect("JSON body");
        let on_long = body["topic"] == spec(&long);
        let want = if on_long { stand_in.clone() } else { spec(&edge) };
        assert_eq!(r.header("apns-collapse-id"), Some(want.as_str()), "{body}");
        // The body still names the whole topic (PUSH-259).
        assert!(on_long || body["topic"] == spec(&edge), "{body}");
        // Sent after `before` and no later than the mock read it.
        let received = r.received_at.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let expiration: u64 = r.header("apns-expiration").expect("apns-expiration").parse().expect("Unix seconds");
        assert!((before + 7200..=received + 7200).contains(&expiration), "{expiration}: {before}..{received} + 7200");
    }
    let on = |token: &str, t: &[u8]| {
        let mut s: Vec<u64> = got
            .iter()
            .filter(|r| r.token == token && r.json().is_some_and(|b| b["topic"] == spec(t)))
            .map(|r| r.json().unwrap()["sequence_id"].as_str().unwrap().parse().unwrap())
            .collect();
        s.sort_unstable();
        s
    };
    assert_eq!(on("aa01", &long), seqs[..2]);
    assert_eq!(on("bb02", &long), seqs[..2]);
    assert_eq!(on("aa01", &edge), seqs[2..]);
}
