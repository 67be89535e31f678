//! Spec 003 §2.5: the relay ingress's idempotency records.

/// Spec 003 §2.5: the relay ingress's idempotency key, a hub's `delivery_id`.
/// Keyed by hub too, so two hubs can never collide (a hub is trusted only
/// for its own ids). Debug shows neither value (PUSH-254 style).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RelayKey {
    pub hub_id: String,
    pub delivery_id: String,
}

crate::domain::redacted_debug!(RelayKey);

/// How a relayed delivery ended, kept for its ttl so a retry of it gets the
/// same answer without another provider request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaySettled {
    /// The provider accepted the push.
    Delivered,
    /// The provider declared the token dead (APNs Unregistered, FCM UNREGISTERED).
    Gone,
    /// The provider refused the push for good (bad token for the topic, too large, ...).
    Rejected,
}

impl RelaySettled {
    /// The stored code; 0 is a pending claim.
    pub fn code(self) -> i8 {
        match self {
            Self::Delivered => 1,
            Self::Gone => 2,
            Self::Rejected => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            1 => Some(Self::Delivered),
            2 => Some(Self::Gone),
            3 => Some(Self::Rejected),
            _ => None,
        }
    }
}

/// The answer of `RelayStore::claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayClaim {
    /// No live record: the caller now holds a pending claim until its
    /// `lease_until_ms` and makes the provider request.
    Claimed,
    /// Another caller holds a pending claim until `lease_until_ms`.
    Busy { lease_until_ms: i64 },
    /// Settled within its ttl.
    Settled(RelaySettled),
}
