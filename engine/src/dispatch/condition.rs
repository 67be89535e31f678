use crate::channel::Channels;
use crate::domain::Subscriber;
use crate::domain::{HmacKey, StoredEnvelope, hmac_epoch};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    Deliver,
    /// PUSH-257 excludes the pair: no delivery may be made.
    Excluded,
    /// PUSH-230 may apply: deliver unless HMAC-SHA256 of the envelope's data
    /// under this key equals its sender_hmac (`suppression::own_keys`). The
    /// data is not in the envelope (windows do not hold it), so the comparison is made per
    /// page, once per distinct key.
    DeliverUnlessOwn(&'a HmacKey),
}

/// PUSH-257 for one subscriber of the envelope's topic, then whether PUSH-230
/// can apply.
pub fn decide<'a>(envelope: &StoredEnvelope, subscriber: &'a Subscriber, channels: &Channels) -> Decision<'a> {
    let stored = &subscriber.subscription;
    if stored.start_position >= envelope.sequence_id {
        return Decision::Excluded;
    }
    if envelope.kind.is_commit_or_proposal() && !stored.subscription.include_commits {
        return Decision::Excluded;
    }
    if !channels.is_configured(subscriber.recipient.target.channel()) {
        return Decision::Excluded;
    }
    match suppression_key(envelope, subscriber) {
        Some(key) => Decision::DeliverUnlessOwn(key),
        None => Decision::Deliver,
    }
}

/// PUSH-230's preconditions, failing open: a sender HMAC and a key
/// at index (epoch of the server timestamp − base) of the subscription's
/// window. Without both, the delivery is never suppressed.
fn suppression_key<'a>(envelope: &StoredEnvelope, subscriber: &'a Subscriber) -> Option<&'a HmacKey> {
    envelope.sender_hmac?;
    let window = subscriber.subscription.subscription.keys.as_ref()?;
    window.key_for_epoch(hmac_epoch(envelope.server_ts_ns))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use hmac::{Hmac, KeyInit, Mac};
    use sha2::Sha256;

    use super::*;
    use crate::channel::{Outcome, Provider, Push, Refusal};
    use crate::dispatch::suppression::is_senders_own;
    use crate::domain::{
        Channel, DeliveryTarget, EnvelopeKind, HMAC_EPOCH_SECONDS, KeyWindow, RecipientId, SecretHash, ShardId,
        SigningKey, StoredSubscription, Subscription, Topic,
    };
    use crate::domain::{Recipient, SenderHmac};

    struct NullProvider;
    #[async_trait]
    impl Provider for NullProvider {
        fn channel(&self) -> Channel {
            Channel::Http
        }
        async fn send(&self, _: Push<'_>) -> Result<Outcome, Refusal> {
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::Rejected
        }
    }

    const EPOCH: i64 = 700;
    const NS: i64 = 1_000_000_000;

    fn http_only() -> Channels {
        let mut channels = Channels::default();
        channels.insert(Arc::new(NullProvider));
        channels
    }

    fn envelope(seq: u64, kind: EnvelopeKind, ts_ns: i64, hmac: Vec<u8>) -> StoredEnvelope {
        StoredEnvelope {
            shard: ShardId::FIRST,
            sequence_id: seq,
            topic: Topic::parse(&[0, 1]).unwrap(),
            kind,
            server_ts_ns: ts_ns,
            sender_hmac: SenderHmac::parse(&hmac),
            data: vec![],
            relay: Default::default(),
        }
    }

    /// The whole rule for one pair: PUSH-257, then PUSH-230 over `data`.
    #[derive(Debug, PartialEq, Eq)]
    enum Verdict {
        Deliver,
        Excluded,
        Suppressed,
    }

    fn verdict(envelope: &StoredEnvelope, data: &[u8], subscriber: &Subscriber, channels: &Channels) -> Verdict {
        match decide(envelope, subscriber, channels) {
            Decision::Excluded => Verdict::Excluded,
            Decision::Deliver => Verdict::Deliver,
            Decision::DeliverUnlessOwn(key) if envelope.sender_hmac.is_some_and(|h| is_senders_own(data, &h, key)) => {
                Verdict::Suppressed
            }
            Decision::DeliverUnlessOwn(_) => Verdict::Deliver,
        }
    }

    fn subscriber(start: u64, include_commits: bool, keys: Option<KeyWindow>, target: DeliveryTarget) -> Subscriber {
        Subscriber {
            recipient: Arc::new(Recipient {
                id: RecipientId::from_bytes([1; 32]),
                secret_hash: SecretHash([2; 32]),
                target,
                renewed_at_ns: 0,
                topic_count: 1,
            }),
            subscription: StoredSubscription {
                subscription: Subscription { topic: Topic::parse(&[0, 1]).unwrap(), keys, include_commits },
                start_position: start,
            },
        }
    }

    fn http() -> DeliveryTarget {
        DeliveryTarget::Http {
            url: crate::domain::WebhookUrl::parse("https://example.com/").unwrap(),
            signing_key: SigningKey::parse(&[0; 16]).unwrap(),
        }
    }

    fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }

    fn window(base: i64) -> KeyWindow {
        KeyWindow::parse(base, &[vec![1; 42], vec![2; 42], vec![3; 42]]).unwrap().unwrap()
    }

    #[test]
    fn push_257_condition_matrix() {
        use EnvelopeKind::*;
        let ch = http_only();
        let ts = EPOCH * HMAC_EPOCH_SECONDS * NS;
        for kind in [Application, Commit, Proposal] {
            for include_commits in [false, true] {
                for (start, seq) in [(5u64, 5u64), (5, 6), (6, 5), (0, 1)] {
                    let sub = subscriber(start, include_commits, None, http());
                    let d = decide(&envelope(seq, kind, ts, vec![]), &sub, &ch);
                    let expected = start < seq && (include_commits || !kind.is_commit_or_proposal());
                    assert_eq!(
                        d == Decision::Deliver,
                        expected,
                        "{kind:?} commits={include_commits} start={start} seq={seq}"
                    );
                }
            }
        }
        // A recipient on a channel the deployment has not configured is excluded.
        let apns = DeliveryTarget::Apns { token: "t".into() };
        assert_eq!(
            decide(&envelope(2, Application, ts, vec![]), &subscriber(1, false, None, apns), &ch),
            Decision::Excluded
        );
    }

    #[test]
    fn push_230_suppression_at_each_window_index() {
        let base = EPOCH - 1;
        for (index, key) in [[1u8; 42], [2; 42], [3; 42]].iter().enumerate() {
            let ts = (base + index as i64) * HMAC_EPOCH_SECONDS * NS;
            let env = envelope(9, EnvelopeKind::Application, ts, hmac(key, b"ciphertext"));
            let sub = subscriber(0, false, Some(window(base)), http());
            assert_eq!(decide(&env, &sub, &http_only()), Decision::DeliverUnlessOwn(&window(base).keys()[index]));
            assert_eq!(verdict(&env, b"ciphertext", &sub, &http_only()), Verdict::Suppressed);
        }
    }

    #[test]
    fn push_230_fails_open() {
        let base = EPOCH - 1;
        let ts = EPOCH * HMAC_EPOCH_SECONDS * NS;
        let good = hmac(&[2; 42], b"ciphertext");
        let ch = http_only();
        let case = |ts: i64, data: &[u8], mac: Vec<u8>, keys: Option<KeyWindow>| {
            verdict(&envelope(9, EnvelopeKind::Application, ts, mac), data, &subscriber(0, false, keys, http()), &ch)
        };
        assert_eq!(case(ts, b"ciphertext", good.clone(), Some(window(base))), Verdict::Suppressed);
        assert_eq!(case(ts, b"ciphertext", good.clone(), None), Verdict::Deliver, "no keys");
        assert_eq!(case(ts, b"other", good.clone(), Some(window(base))), Verdict::Deliver, "different data");
        assert_eq!(case(ts, b"ciphertext", good[..31].to_vec(), Some(window(base))), Verdict::Deliver, "31-byte hmac");
        assert_eq!(case(ts, b"ciphertext", vec![], Some(window(base))), Verdict::Deliver, "no hmac");
        // Epoch boundaries: last ns of the epoch before the window, first ns after it.
        let before = base * HMAC_EPOCH_SECONDS * NS - 1;
        let after = (base + 3) * HMAC_EPOCH_SECONDS * NS;
        assert_eq!(case(before, b"ciphertext", hmac(&[1; 42], b"ciphertext"), Some(window(base))), Verdict::Deliver);
        assert_eq!(case(after, b"ciphertext", hmac(&[3; 42], b"ciphertext"), Some(window(base))), Verdict::Deliver);
        // The first ns of an epoch uses that epoch's key, not the previous one's.
        let first_of_epoch = EPOCH * HMAC_EPOCH_SECONDS * NS;
        assert_eq!(
            case(first_of_epoch, b"ciphertext", hmac(&[1; 42], b"ciphertext"), Some(window(base))),
            Verdict::Deliver
        );
        assert_eq!(
            case(first_of_epoch - 1, b"ciphertext", hmac(&[1; 42], b"ciphertext"), Some(window(base))),
            Verdict::Suppressed
        );
    }
}
