//! First attempts detached from their page (docs/ARCHITECTURE.md, "Channels
//! fail alone"). A first attempt still in flight after `DETACH_AFTER` while
//! another channel is active (its provider hangs, stalls in the TLS
//! handshake or answers slowly) is parked while it runs: its row is written
//! with no attempt made, and once the row is durable its page counts it
//! settled, so the page, the window and the checkpoint move on without it
//! (PUSH-257 holds through the row, as for any parked delivery). Its answer
//! then deletes the row, or, when it is to be retried, stores the attempt
//! in it for the shard's owner to send again.
//!
//! While it is in flight the shard's owner does not hand its row out
//! (`Parking::is_detached`): the row is there for a crash or a handover,
//! not to send the delivery a second time beside its attempt.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::parking::Parking;
use super::{Delivery, FirstAttempt};
use crate::channel::Sent;
use crate::domain::{Channel, ParkedDelivery, ParkedPlace, Recipient, ShardId, StoredEnvelope, Timestamp};
use crate::metrics::{Metrics, ParkReason};
use crate::store::Store;

/// How long a first attempt may hold its page while another channel is
/// active: a healthy provider answers within milliseconds, and one that has
/// not in a second is hung or slow (the same second a channel's ready
/// deliveries may wait for a slot, `lanes::LAG_AFTER`). An attempt of a
/// stalled channel (`Parking::stalled`: nothing of it answered lately) is
/// detached after `STALLED_AFTER` already: every page that holds such an
/// attempt waits that long, so it sets how much of the other channels'
/// pace a hung provider takes. The rows of all the attempts one check
/// detaches are written at once (`begin`).
pub(super) const DETACH_AFTER: Duration = Duration::from_secs(1);

/// How often a worker with attempts in flight looks for first attempts that
/// held their pages `DETACH_AFTER`.
pub(super) const DETACH_CHECK: Duration = Duration::from_millis(100);

/// The row that keeps `delivery` while it is parked.
pub(super) fn parked_row(delivery: &Delivery) -> ParkedDelivery {
    row(&delivery.envelope, &delivery.recipient, delivery.attempts, delivery.all_gone)
}

fn row(envelope: &StoredEnvelope, recipient: &Recipient, attempts: u32, all_gone: bool) -> ParkedDelivery {
    ParkedDelivery {
        shard: envelope.shard,
        channel: recipient.target.channel(),
        sequence_id: envelope.sequence_id,
        recipient: recipient.id,
        topic: envelope.topic.clone(),
        kind: envelope.kind,
        server_ts_ns: envelope.server_ts_ns,
        attempts,
        all_gone,
    }
}

/// An attempt's answer, kept while its row is being written.
pub(super) enum Answered {
    /// The delivery, what its channel reported and when the attempt left.
    Done(Delivery, Sent, Timestamp),
    /// The attempt panicked: its delivery is lost with it.
    Lost,
}

/// Where a first attempt in flight stands with respect to its page.
pub(super) enum Detach {
    /// Not detachable: a retry, or a delivery handed back from its row
    /// (which its row already keeps).
    No,
    /// A first attempt of its page, which may be detached.
    May { envelope: Arc<StoredEnvelope>, recipient: Arc<Recipient>, first: FirstAttempt },
    /// Its row is being written; its answer, if it came meanwhile.
    Writing { row: ParkedPlace, first: FirstAttempt, answer: Option<Answered> },
    /// Its row was written (or its write failed); its answer settles it.
    Detached(ParkedPlace),
}

impl Detach {
    /// For an attempt of `delivery` about to start.
    pub(super) fn of(delivery: &Delivery) -> Self {
        match &delivery.first_attempt {
            Some(first) if !delivery.unparked => Detach::May {
                envelope: delivery.envelope.clone(),
                recipient: delivery.recipient.clone(),
                first: first.clone(),
            },
            _ => Detach::No,
        }
    }

    /// The shard and channel of a first attempt that may be detached.
    pub(super) fn may(&self) -> Option<(ShardId, Channel)> {
        match self {
            Detach::May { envelope, recipient, first } if !first.window_dropped() => {
                Some((envelope.shard, recipient.target.channel()))
            }
            _ => None,
        }
    }

    /// Starts detaching (the caller checked `may`): returns the row to
    /// write, which the caller writes with the others of its check, in one
    /// write. Until the attempt's answer has been applied, the shard's owner
    /// does not hand the row out.
    pub(super) fn begin(&mut self, parking: &Parking) -> Option<ParkedDelivery> {
        let Detach::May { envelope, recipient, first } = std::mem::replace(self, Detach::No) else { return None };
        let row = row(&envelope, &recipient, 0, true);
        let place = row.place();
        parking.detach(place);
        *self = Detach::Writing { row: place, first, answer: None };
        Some(row)
    }

    /// The row's write ended (`stored`): the page counts the delivery
    /// settled if it was stored. Returns the answer that came meanwhile.
    pub(super) fn written(&mut self, stored: bool, metrics: &Metrics) -> Option<Answered> {
        let Detach::Writing { row, first, answer } = std::mem::replace(self, Detach::No) else { return None };
        let label = row.channel.as_str();
        if stored {
            metrics.parking.parked.with_label_values(&[label, ParkReason::InFlight.as_str()]).inc();
            first.park();
        } else {
            // Its page waits for its answer, as if it had not been detached;
            // the row may still have been stored, so the answer settles it
            // as a detached one's.
            metrics.parking.park_failures.with_label_values(&[label]).inc();
        }
        *self = Detach::Detached(row);
        answer
    }
}

/// What becomes of a detached attempt's row once its answer was applied.
pub(super) enum Then<'a> {
    /// Answered for good (delivered, or a final failure): deleted.
    Delete,
    /// To be retried: rewritten with the attempts made, for its shard's
    /// owner to send again (spec 000 §7 delays and `max_attempts` as for any
    /// parked retry).
    Retry(&'a Delivery),
    /// The attempt panicked: the row stays, for its owner to send.
    Keep,
}

/// Applies `then` to the row at `place` in a task of `writes`; the shard's
/// owner may hand the row out again once it is done, and looks for a row
/// that stays from its sequence id on. A rewrite that fails leaves the
/// first attempt's row (one attempt more at most); a delete that fails
/// leaves the row (one delivery more at most): never a loss.
pub(super) fn settle(
    place: ParkedPlace,
    then: Then<'_>,
    parking: &Arc<Parking>,
    store: &Arc<dyn Store>,
    metrics: &Metrics,
    writes: &mut JoinSet<()>,
) {
    let rewrite = match then {
        Then::Retry(delivery) => {
            let label = place.channel.as_str();
            metrics.parking.parked.with_label_values(&[label, ParkReason::Retry.as_str()]).inc();
            Some(Some(parked_row(delivery)))
        }
        Then::Keep => Some(None),
        Then::Delete => None,
    };
    let (parking, store) = (parking.clone(), store.clone());
    writes.spawn(async move {
        let stays = match rewrite {
            Some(Some(row)) => {
                let _ = store.parked().park(&[row]).await;
                true
            }
            Some(None) => true,
            None => store.parked().unpark(place.shard, place.channel, &[place.key]).await.is_err(),
        };
        parking.attach(place);
        if stays {
            parking.parked(place.shard, place.channel, place.key.sequence_id);
        }
    });
}
