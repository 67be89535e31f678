//! A recipient as the engine knows it once registered: the store keeps it,
//! dispatch and delivery read it. Domain data, not a storage detail.

use std::sync::Arc;

use super::{Channel, DeliveryTarget, RecipientId, SecretHash, StoredSubscription};

/// A stored recipient: what delivery needs and the SHA-256 of its secret (PUSH-254).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub id: RecipientId,
    pub secret_hash: SecretHash,
    pub target: DeliveryTarget,
    /// Time of the last successful Register or UpdateSubscriptions, Unix ns (PUSH-255).
    pub renewed_at_ns: i64,
    pub topic_count: u64,
}

/// What the backend reports after a mutating call (PUSH-255), before the TTL is added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecipientSummary {
    pub topic_count: u64,
    pub channel: Channel,
    pub renewed_at_ns: i64,
}

/// One subscriber of a topic, joined with its recipient, as dispatch reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    /// Shared: every delivery of the page holds it, and the embedded store
    /// hands out one decoded copy per unchanged record.
    pub recipient: Arc<Recipient>,
    pub subscription: StoredSubscription,
}
