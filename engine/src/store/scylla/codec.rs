//! Rows of the CQL tables ↔ domain values. u64 ids and positions are stored as
//! their two's-complement `bigint`; sequence ids are split into a bucket and a
//! position so envelope partitions stay bounded.

use std::borrow::Cow;

use crate::domain::{
    Channel, DeliveryTarget, EnvelopeKind, KeyWindow, MembershipChange, MessageId, Recipient, RecipientId,
    RegistrationInput, RelayMeta, RelayRegistration, SecretHash, SenderHmac, ShardId, SigningKey, StoredEnvelope,
    StoredSubscription, Subscription, Topic, WebPushKeys, WebhookUrl,
};
use crate::store::StoreError;

/// Envelopes per (shard, bucket) partition.
pub(super) const BUCKET_SIZE: u64 = 4096;

pub(super) fn bucket_of(seq: u64) -> i64 {
    (seq / BUCKET_SIZE) as i64
}

pub(super) fn pos_of(seq: u64) -> i32 {
    (seq % BUCKET_SIZE) as i32
}

pub(super) fn seq_of(bucket: i64, pos: i32) -> u64 {
    bucket as u64 * BUCKET_SIZE + pos as u64
}

pub(super) fn to_db(v: u64) -> i64 {
    v as i64
}

pub(super) fn from_db(v: i64) -> u64 {
    v as u64
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Backend(format!("corrupt {what} row"))
}

/// The static (recipient) columns, in the order every statement selects them:
/// version, secret_hash, channel, target, signing_key, renewed_at, topic_count.
pub(super) type StaticRow =
    (Option<i64>, Option<Vec<u8>>, Option<i8>, Option<String>, Option<Vec<u8>>, Option<i64>, Option<i64>);

/// The subscription columns: start_position, include_commits, hmac_epoch_base, hmac_keys.
pub(super) type SubRow = (Option<i64>, Option<bool>, Option<i64>, Option<Vec<Vec<u8>>>);

/// A recipient as read, with the version its next conditional write must name.
#[derive(Debug, Clone)]
pub(super) struct Versioned {
    pub version: i64,
    pub recipient: Recipient,
}

/// `None` when the partition holds no recipient.
pub(super) fn decode_static(id: RecipientId, row: StaticRow) -> Result<Option<Versioned>, StoreError> {
    const WHAT: &str = "recipient";
    let (version, hash, channel, target, signing_key, renewed_at, topic_count) = row;
    let Some(version) = version else {
        return Ok(None);
    };
    let hash: [u8; 32] = hash.as_deref().and_then(|h| h.try_into().ok()).ok_or_else(|| corrupt(WHAT))?;
    let target_text = target.ok_or_else(|| corrupt(WHAT))?;
    let channel =
        channel.and_then(|c| u8::try_from(c).ok()).and_then(Channel::from_storage_tag).ok_or_else(|| corrupt(WHAT))?;
    let target = match channel {
        Channel::Apns => DeliveryTarget::Apns { token: target_text },
        Channel::Fcm => DeliveryTarget::Fcm { token: target_text },
        #[cfg(test)]
        Channel::Probe => DeliveryTarget::Probe { token: target_text },
        Channel::Http => DeliveryTarget::Http {
            url: WebhookUrl::parse(&target_text).map_err(|_| corrupt(WHAT))?,
            signing_key: signing_key.as_deref().and_then(|k| SigningKey::parse(k).ok()).ok_or_else(|| corrupt(WHAT))?,
        },
        // 003 §1: a removed registration is JSON `null`.
        Channel::Relay if target_text == NO_REGISTRATION => DeliveryTarget::Relay(None),
        Channel::Relay => DeliveryTarget::Relay(Some(decode_relay(&target_text).ok_or_else(|| corrupt(WHAT))?)),
        // The keys in the signing_key column: p256dh (65 bytes), then auth.
        Channel::WebPush => DeliveryTarget::WebPush {
            endpoint: WebhookUrl::parse(&target_text).map_err(|_| corrupt(WHAT))?,
            keys: signing_key
                .as_deref()
                .and_then(|k| k.split_at_checked(WebPushKeys::P256DH_LEN))
                .and_then(|(p256dh, auth)| WebPushKeys::parse(p256dh, auth).ok())
                .ok_or_else(|| corrupt(WHAT))?,
        },
    };
    Ok(Some(Versioned {
        version,
        recipient: Recipient {
            id,
            secret_hash: SecretHash(hash),
            target,
            renewed_at_ns: renewed_at.ok_or_else(|| corrupt(WHAT))?,
            topic_count: topic_count.map(from_db).ok_or_else(|| corrupt(WHAT))?,
        },
    }))
}

/// The target's columns: channel, target text (token, URL, Web Push
/// endpoint, or a relay registration as a JSON object of its §1 fields),
/// signing key (a webhook's, or a Web Push subscription's p256dh || auth).
pub(super) fn encode_target(target: &DeliveryTarget) -> (i8, Cow<'_, str>, Option<Cow<'_, [u8]>>) {
    let channel = target.channel().storage_tag() as i8;
    match target {
        DeliveryTarget::Apns { token } | DeliveryTarget::Fcm { token } => (channel, Cow::Borrowed(token), None),
        #[cfg(test)]
        DeliveryTarget::Probe { token } => (channel, Cow::Borrowed(token), None),
        DeliveryTarget::Http { url, signing_key } => {
            (channel, Cow::Borrowed(url.as_str()), Some(Cow::Borrowed(signing_key.as_bytes())))
        }
        DeliveryTarget::Relay(None) => (channel, Cow::Borrowed(NO_REGISTRATION), None),
        DeliveryTarget::Relay(Some(r)) => (channel, Cow::Owned(encode_relay(r)), None),
        DeliveryTarget::WebPush { endpoint, keys } => {
            (channel, Cow::Borrowed(endpoint.as_str()), Some(Cow::Owned([&keys.p256dh()[..], keys.auth()].concat())))
        }
    }
}

/// The `target` of a relay device whose registration was removed (003 §1).
const NO_REGISTRATION: &str = "null";

/// Spec 003 §1's fields as one JSON object in the `target` column: the
/// registration is read and replaced whole, so it needs no columns of its own.
fn encode_relay(r: &RelayRegistration) -> String {
    let mut o = serde_json::Map::new();
    o.insert("provider".into(), r.provider().into());
    o.insert("token".into(), r.token().into());
    for (key, value) in [("app_id", r.app_id()), ("p256dh", r.p256dh()), ("auth", r.auth())] {
        if let Some(v) = value {
            o.insert(key.into(), v.into());
        }
    }
    if let Some(sandbox) = r.sandbox() {
        o.insert("sandbox".into(), sandbox.into());
    }
    serde_json::Value::Object(o).to_string()
}

fn decode_relay(text: &str) -> Option<RelayRegistration> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let s = |key: &str| v.get(key).and_then(serde_json::Value::as_str);
    RelayRegistration::parse(RegistrationInput {
        provider: s("provider")?,
        token: s("token")?,
        app_id: s("app_id"),
        sandbox: v.get("sandbox").and_then(serde_json::Value::as_bool),
        p256dh: s("p256dh"),
        auth: s("auth"),
    })
    .ok()
}

/// `None` for a row of the partition that is not a subscription.
pub(super) fn decode_subscription(topic: Topic, row: SubRow) -> Result<Option<StoredSubscription>, StoreError> {
    const WHAT: &str = "subscription";
    let (start, include_commits, base, keys) = row;
    let Some(start) = start else {
        return Ok(None);
    };
    let keys = match keys {
        // Section 3: no base is stored without keys.
        None => None,
        Some(keys) => KeyWindow::parse(base.ok_or_else(|| corrupt(WHAT))?, &keys).map_err(|_| corrupt(WHAT))?,
    };
    Ok(Some(StoredSubscription {
        subscription: Subscription { topic, keys, include_commits: include_commits.unwrap_or(false) },
        start_position: from_db(start),
    }))
}

/// The subscription columns to write: start_position, include_commits,
/// hmac_epoch_base, hmac_keys (null base and keys without a window).
pub(super) fn encode_subscription(s: &StoredSubscription) -> (i64, bool, Option<i64>, Option<Vec<Vec<u8>>>) {
    let (base, keys) = match &s.subscription.keys {
        None => (None, None),
        Some(w) => (Some(w.epoch_base()), Some(w.keys().iter().map(|k| k.0.to_vec()).collect())),
    };
    (to_db(s.start_position), s.subscription.include_commits, base, keys)
}

/// The envelope columns a window reads: pos, topic, kind, server_ts,
/// sender_hmac, inline_data, message_id, membership (the last three: schema
/// 4, 003 §3). Never `data`: `inline_data` holds it only when it
/// is at most `MAX_INLINE_DATA` bytes, for the relay channel.
pub(super) type EnvelopeRow = (i32, Vec<u8>, i8, i64, Option<Vec<u8>>, Option<Vec<u8>>, Option<String>, Option<i8>);

pub(super) fn decode_envelope(shard: ShardId, bucket: i64, row: EnvelopeRow) -> Result<StoredEnvelope, StoreError> {
    const WHAT: &str = "envelope";
    let (pos, topic, kind, server_ts, sender_hmac, data, message_id, membership) = row;
    let relay = RelayMeta {
        message_id: message_id.map(|m| MessageId::parse(&m).map_err(|_| corrupt(WHAT))).transpose()?,
        membership: membership
            .filter(|&m| m != 0)
            .map(|m| u8::try_from(m).ok().and_then(MembershipChange::from_u8).ok_or_else(|| corrupt(WHAT)))
            .transpose()?,
    };
    Ok(StoredEnvelope {
        shard,
        sequence_id: seq_of(bucket, pos),
        topic: Topic::parse(&topic).map_err(|_| corrupt(WHAT))?,
        kind: u8::try_from(kind).ok().and_then(EnvelopeKind::from_u8).ok_or_else(|| corrupt(WHAT))?,
        server_ts_ns: server_ts,
        // Empty or null without an HMAC: the format kept from before `SenderHmac`.
        sender_hmac: match sender_hmac.as_deref() {
            None | Some([]) => None,
            Some(hmac) => Some(SenderHmac::parse(hmac).ok_or_else(|| corrupt(WHAT))?),
        },
        data: data.unwrap_or_default(),
        relay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_ids_split_and_join() {
        for seq in [0, 1, 4095, 4096, 4097, u64::MAX, u64::MAX - 4096, 1 << 63] {
            let (b, p) = (bucket_of(seq), pos_of(seq));
            assert!(b >= 0 && (0..4096).contains(&p));
            assert_eq!(seq_of(b, p), seq);
        }
        assert!(bucket_of(4095) < bucket_of(4096));
        assert_eq!(from_db(to_db(u64::MAX)), u64::MAX);
    }
}
