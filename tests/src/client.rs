//! Request builders for the notification and publish services.

use fanout_proto::v1 as pb;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

/// A recipient as a client holds it: 32 random bytes of id and of secret.
#[derive(Clone)]
pub struct Recipient {
    pub id: Vec<u8>,
    pub secret: Vec<u8>,
}

impl Recipient {
    pub fn random() -> Self {
        let mut id = vec![0; 32];
        let mut secret = vec![0; 32];
        rand::rng().fill_bytes(&mut id);
        rand::rng().fill_bytes(&mut secret);
        Self { id, secret }
    }

    pub fn id_hex(&self) -> String {
        hex::encode(&self.id)
    }

    pub fn register_http(&self, url: &str, signing_key: &[u8]) -> pb::RegisterRequest {
        self.register(pb::register_request::Delivery::Http(pb::HttpDelivery {
            url: url.into(),
            signing_key: signing_key.to_vec(),
        }))
    }

    pub fn register(&self, delivery: pb::register_request::Delivery) -> pb::RegisterRequest {
        pb::RegisterRequest {
            recipient_id: self.id.clone(),
            recipient_secret: self.secret.clone(),
            delivery: Some(delivery),
        }
    }

    /// Spec 003 §1 over gRPC: a relay registration with provider and token.
    pub fn register_relay(&self, provider: &str, token: &str) -> pb::RegisterRequest {
        self.register(pb::register_request::Delivery::Relay(pb::RelayDelivery {
            provider: provider.into(),
            token: token.into(),
            ..Default::default()
        }))
    }

    /// The HTTP API's bearer credential: `<id hex>.<secret hex>`.
    pub fn bearer(&self) -> String {
        format!("Bearer {}.{}", hex::encode(&self.id), hex::encode(&self.secret))
    }

    pub fn unregister(&self) -> pb::UnregisterRequest {
        pb::UnregisterRequest { recipient_id: self.id.clone(), recipient_secret: self.secret.clone() }
    }

    pub fn update(&self, adds: Vec<pb::Subscription>, removes: Vec<Vec<u8>>) -> pb::UpdateSubscriptionsRequest {
        pb::UpdateSubscriptionsRequest {
            recipient_id: self.id.clone(),
            recipient_secret: self.secret.clone(),
            adds,
            removes,
        }
    }
}

/// A group-message topic (kind 0x00) with a random 16-byte identifier.
pub fn group_topic() -> Vec<u8> {
    topic_of_kind(0x00)
}

/// A welcome topic (kind 0x01) with a random 16-byte identifier.
pub fn welcome_topic() -> Vec<u8> {
    topic_of_kind(0x01)
}

pub fn topic_of_kind(kind: u8) -> Vec<u8> {
    let mut t = vec![kind; 17];
    rand::rng().fill_bytes(&mut t[1..]);
    t
}

pub fn subscription(topic: &[u8]) -> pb::Subscription {
    pb::Subscription { topic: topic.to_vec(), hmac_epoch_base: 0, hmac_keys: vec![], include_commits: false }
}

pub fn envelope(topic: &[u8], kind: pb::EnvelopeKind, should_push: bool) -> pb::Envelope {
    pb::Envelope {
        topic: topic.to_vec(),
        kind: kind as i32,
        should_push,
        sender_hmac: vec![],
        data: b"opaque ciphertext".to_vec(),
        ..pb::Envelope::default()
    }
}

/// HMAC-SHA256 of `data` under `key` (PUSH-258's sender_hmac).
pub fn sender_hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The HMAC epoch of now (30-day periods of Unix seconds).
pub fn current_epoch() -> i64 {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    secs / 2_592_000
}
