//! Routing again an envelope that, as far as this node can tell, was stored
//! nowhere: why (the `reason` label of `fanout_forward_retries_total`), how
//! long to pause first, and how often at most. Leases move within a lease
//! round or two (a node leaving or joining), so a few short pauses bridge
//! the gap a publisher would otherwise see as an error.

use std::time::Duration;

/// Why an envelope is routed again; each proves nothing was stored for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Retry {
    /// No node held its shard (here, or as the owner it was sent to answered).
    NoOwner,
    /// The node it was sent to answered that another node holds the shard now.
    OwnerMoved,
    /// No connection to the owner could be opened: nothing was sent.
    NotConnected,
}

impl Retry {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// At most this many routings of one envelope (the first included): the
/// caller's deadline normally ends them first.
pub const MAX_ROUTES: u32 = 24;

/// The pause before routing again for the `routed`-th time (1: the first
/// time again): 50 ms, doubling up to 400 ms, about a tenth of the shortest
/// lease round.
pub fn pause(routed: u32) -> Duration {
    Duration::from_millis(50 << routed.saturating_sub(1).min(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_a_bound_and_every_reason_has_a_label() {
        let pauses: Vec<u64> = (1..=6).map(|n| pause(n).as_millis() as u64).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 400, 400]);
        let total: Duration = (1..MAX_ROUTES).map(pause).sum();
        assert!(total >= Duration::from_secs(8), "routes span a lease round or two: {total:?}");
        assert_eq!(Retry::OwnerMoved.as_str(), "owner_moved");
    }
}
