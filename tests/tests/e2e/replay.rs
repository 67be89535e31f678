//! PUSH-257 after a crash or a shutdown: a `kill -9` or a SIGTERM mid-window
//! loses nothing; every delivery above the checkpoint is attempted again after
//! the restart.

use std::collections::HashSet;
use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_testkit::MockWebhookConfig;
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

const RECIPIENTS: usize = 60;
const ENVELOPES: usize = 5;

#[derive(Clone, Copy, Debug)]
enum Stop {
    Kill9,
    Sigterm,
}

#[tokio::test]
async fn kill_9_mid_window_replays_every_unattempted_delivery() {
    stop_mid_window_and_restart(Stop::Kill9).await;
}

#[tokio::test]
async fn sigterm_mid_window_exits_cleanly_and_the_restart_delivers_the_rest() {
    stop_mid_window_and_restart(Stop::Sigterm).await;
}

async fn stop_mid_window_and_restart(stop: Stop) {
    // A slow receiver and few attempts in flight make the window long enough
    // to kill the engine in the middle of it.
    let config = EngineConfig {
        engine_extra: "[engine.delivery]\nworkers = 2\nmax_in_flight_per_worker = 4".into(),
        ..EngineConfig::default()
    };
    // For SIGTERM the window must outlast the 5 s drain timeout of the harness:
    // 300 deliveries × 300 ms / 8 in flight ≈ 11 s.
    let latency = Duration::from_millis(match stop {
        Stop::Kill9 => 100,
        Stop::Sigterm => 300,
    });
    let receiver = MockWebhookConfig { latency, ..MockWebhookConfig::default() };
    let mut setup = webhook_setup_with(config, receiver).await;
    let topic = group_topic();
    let key = [7u8; 32];
    let recipients: Vec<Recipient> = (0..RECIPIENTS).map(|_| Recipient::random()).collect();
    for r in &recipients {
        register_webhook(&setup, r, "/hook", &key, vec![subscription(&topic)]).await;
    }
    let envelopes = (0..ENVELOPES).map(|_| envelope(&topic, pb::EnvelopeKind::Application, true)).collect();
    let seqs: Vec<u64> = publish(&setup.fanout, envelopes).await.iter().map(sequence_id).collect();

    // Kill once some, but far from all, deliveries have arrived.
    let total = RECIPIENTS * ENVELOPES;
    setup.receiver.wait_for(total / 10, DELIVERY_WAIT).await;
    match stop {
        Stop::Kill9 => setup.fanout.kill9(),
        Stop::Sigterm => {
            let status = setup.fanout.terminate().expect("terminate");
            assert!(status.success(), "SIGTERM exit status {status}");
        }
    }
    let before_restart = setup.receiver.received_count();
    assert!(before_restart < total, "the kill came too late to test anything");

    setup.fanout.restart().await.expect("restart");
    let expected: HashSet<(String, String)> =
        recipients.iter().flat_map(|r| seqs.iter().map(move |s| (r.id_hex(), s.to_string()))).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: HashSet<(String, String)> = setup
            .receiver
            .received()
            .iter()
            .filter(|r| r.signature_valid == Some(true))
            .filter_map(|r| r.json())
            .map(|j| (j["recipient_id"].as_str().unwrap().to_owned(), j["sequence_id"].as_str().unwrap().to_owned()))
            .collect();
        let missing = expected.difference(&seen).count();
        if missing == 0 {
            assert!(seen.is_subset(&expected), "nothing outside the expected pairs");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing} of {total} deliveries never arrived after the restart; log:\n{}",
            setup.fanout.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "{stop:?} after {before_restart} of {total} deliveries; {} requests in all ({} repeats)",
        setup.receiver.received_count(),
        setup.receiver.received_count() - total
    );
}
