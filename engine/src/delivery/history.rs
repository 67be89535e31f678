//! The delivery history: the recent attempts of each recipient on this node,
//! for an operator asking "why didn't this device get its push?".
//!
//! One task owns a bounded ring of records (`max_records` on the node, at
//! most `PER_RECIPIENT` per recipient, the oldest going first). Each delivery
//! worker hands it the records of the attempts it settled in batches (a few
//! hundred, or what it has every 50 ms), without waiting: when its queue is
//! full a batch is dropped and counted, so keeping the history never slows a
//! delivery. A record holds positions, symbols, numbers and times only: no
//! token, URL, topic or payload (PUSH-254).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::channel::Reason;
use crate::domain::{Channel, RecipientId};

/// Records kept per recipient; older ones go first.
pub const PER_RECIPIENT: usize = 32;
/// Batches of records waiting for the history's task; beyond, they are
/// dropped.
const QUEUE: usize = 1024;
/// The longest a query waits for the history's task.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// `[engine.history]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistorySettings {
    /// Attempt records kept on this node, the most recent; 0 turns the
    /// history off. 32,000 records kept added 20–30 MiB of peak RSS in the
    /// load harness (docs/BENCHMARKS.md, "The delivery history's cost").
    pub max_records: usize,
}

impl Default for HistorySettings {
    fn default() -> Self {
        Self { max_records: 65_536 }
    }
}

/// One settled attempt (or a send that never left: `attempt` is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    pub recipient: RecipientId,
    pub shard: u16,
    pub sequence_id: u64,
    pub channel: Channel,
    /// 1 for the first attempt; `None`: nothing reached the provider (not an
    /// attempt, spec 000 "Terms").
    pub attempt: Option<u32>,
    /// The attempt's outcome (`Outcome::label`).
    pub outcome: &'static str,
    /// How the delivery ended, when this attempt ended it
    /// (`Outcome::delivery_label`); `None`: it is retried.
    pub ended: Option<&'static str>,
    pub retry_in: Option<Duration>,
    pub provider_status: Option<u16>,
    pub provider_reason: Option<Reason>,
    /// Unix milliseconds: when the envelope was stored, when the delivery's
    /// first attempt left (when this node knows), when this one left, and
    /// when its answer (or its end) came.
    pub published_at_ms: i64,
    pub first_attempt_at_ms: Option<i64>,
    pub sent_at_ms: i64,
    pub answered_at_ms: i64,
}

/// What a query returns: the recipient's records, newest first, and how
/// many records the node dropped since start because the history's queue
/// was full (non-zero: the list may miss attempts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    pub attempts: Vec<AttemptRecord>,
    pub dropped: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("the delivery history did not answer")]
pub struct HistoryUnavailable;

enum Message {
    Records(Vec<AttemptRecord>),
    Query(RecipientId, oneshot::Sender<Vec<AttemptRecord>>),
}

/// The handle the workers record through and the API queries.
#[derive(Clone)]
pub struct History {
    tx: mpsc::Sender<Message>,
    dropped: Arc<AtomicU64>,
}

impl History {
    /// Starts the history's task; `None` when `max_records` is 0 (off).
    pub fn start(settings: &HistorySettings) -> Option<Self> {
        let max = settings.max_records;
        if max == 0 {
            return None;
        }
        let (tx, mut rx) = mpsc::channel(QUEUE);
        tokio::spawn(async move {
            let mut ring = Ring::new(max);
            while let Some(message) = rx.recv().await {
                match message {
                    Message::Records(records) => records.into_iter().for_each(|r| ring.push(r)),
                    Message::Query(recipient, reply) => {
                        let _ = reply.send(ring.of(&recipient));
                    }
                }
            }
        });
        Some(Self { tx, dropped: Arc::default() })
    }

    /// Hands `records` over without waiting; dropped (and counted) when the
    /// queue is full.
    pub fn record(&self, records: Vec<AttemptRecord>) {
        let n = records.len() as u64;
        if self.tx.try_send(Message::Records(records)).is_err() {
            self.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The recipient's records on this node, newest first.
    pub async fn of(&self, recipient: RecipientId) -> Result<Recent, HistoryUnavailable> {
        let (reply, answer) = oneshot::channel();
        let asked = async {
            self.tx.send(Message::Query(recipient, reply)).await.map_err(|_| HistoryUnavailable)?;
            answer.await.map_err(|_| HistoryUnavailable)
        };
        let attempts = tokio::time::timeout(QUERY_TIMEOUT, asked).await.map_err(|_| HistoryUnavailable)??;
        Ok(Recent { attempts, dropped: self.dropped.load(Ordering::Relaxed) })
    }
}

/// The records, bounded on the node and per recipient. `order` lists every
/// record by its number, oldest first (entries of records already gone with
/// their recipient's bound are skipped), and is bounded too.
struct Ring {
    max: usize,
    next: u64,
    by_recipient: HashMap<RecipientId, VecDeque<(u64, AttemptRecord)>>,
    order: VecDeque<(u64, RecipientId)>,
}

impl Ring {
    fn new(max: usize) -> Self {
        Self { max, next: 0, by_recipient: HashMap::new(), order: VecDeque::new() }
    }

    fn push(&mut self, record: AttemptRecord) {
        let n = self.next;
        self.next += 1;
        let recipient = record.recipient;
        let kept = self.by_recipient.entry(recipient).or_default();
        kept.push_back((n, record));
        if kept.len() > PER_RECIPIENT {
            kept.pop_front();
        }
        self.order.push_back((n, recipient));
        while self.order.len() > self.max {
            let Some((oldest, whose)) = self.order.pop_front() else { break };
            if let Some(kept) = self.by_recipient.get_mut(&whose) {
                if kept.front().is_some_and(|(k, _)| *k == oldest) {
                    kept.pop_front();
                }
                if kept.is_empty() {
                    self.by_recipient.remove(&whose);
                }
            }
        }
    }

    fn of(&self, recipient: &RecipientId) -> Vec<AttemptRecord> {
        self.by_recipient
            .get(recipient)
            .map_or_else(Vec::new, |kept| kept.iter().rev().map(|(_, r)| r.clone()).collect())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_recipient.values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(recipient: u8, sequence_id: u64) -> AttemptRecord {
        AttemptRecord {
            recipient: RecipientId::from_bytes([recipient; 32]),
            shard: 1,
            sequence_id,
            channel: Channel::Http,
            attempt: Some(1),
            outcome: "delivered",
            ended: Some("delivered"),
            retry_in: None,
            provider_status: Some(200),
            provider_reason: None,
            published_at_ms: 1,
            first_attempt_at_ms: Some(2),
            sent_at_ms: 2,
            answered_at_ms: 3,
        }
    }

    fn sequences(ring: &Ring, recipient: u8) -> Vec<u64> {
        ring.of(&RecipientId::from_bytes([recipient; 32])).iter().map(|r| r.sequence_id).collect()
    }

    #[test]
    fn a_recipient_keeps_its_latest_records_newest_first() {
        let mut ring = Ring::new(1000);
        for seq in 0..40 {
            ring.push(record(1, seq));
        }
        let kept = sequences(&ring, 1);
        assert_eq!(kept.len(), PER_RECIPIENT);
        assert_eq!((kept[0], kept[PER_RECIPIENT - 1]), (39, 8), "newest first, the oldest gone");
        assert!(sequences(&ring, 2).is_empty());
    }

    #[test]
    fn the_node_keeps_its_latest_records_whoever_they_are_for() {
        let mut ring = Ring::new(10);
        for seq in 0..8 {
            ring.push(record(1, seq));
        }
        for seq in 100..106 {
            ring.push(record(2, seq));
        }
        assert_eq!(ring.len(), 10);
        assert_eq!(sequences(&ring, 1), vec![7, 6, 5, 4]);
        assert_eq!(sequences(&ring, 2).len(), 6);
        // One recipient's flood stays bounded in both ways.
        for seq in 0..10_000 {
            ring.push(record(3, seq));
        }
        assert!(ring.order.len() <= 10 && ring.len() <= 10);
        assert_eq!(sequences(&ring, 3).len(), 10);
        assert!(sequences(&ring, 1).is_empty() && sequences(&ring, 2).is_empty());
        assert_eq!(ring.by_recipient.len(), 1, "emptied recipients are forgotten");
    }

    #[tokio::test]
    async fn records_are_kept_and_answered_and_off_means_none() {
        assert!(History::start(&HistorySettings { max_records: 0 }).is_none());
        let history = History::start(&HistorySettings::default()).unwrap();
        history.record(vec![record(7, 1), record(7, 2)]);
        let recent = history.of(RecipientId::from_bytes([7; 32])).await.unwrap();
        assert_eq!(recent.attempts.iter().map(|r| r.sequence_id).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(recent.dropped, 0);
        assert!(history.of(RecipientId::from_bytes([8; 32])).await.unwrap().attempts.is_empty());
    }
}
