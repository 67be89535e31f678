//! Where dispatch hands each channel's deliveries. Every configured channel
//! has a sink: the delivery workers by default (they send through the
//! channel's `Provider`), or the channel's own queue when it keeps one (the
//! relay's, spec 003 §4). Dispatch looks the sink up the same way for every
//! row of the channel table. A recipient whose channel is no longer
//! configured goes to the workers, which settle it as such.

use std::collections::HashMap;
use std::sync::Arc;

use crate::channel::Channels;
use crate::domain::Channel;
use crate::page::{Batch, Sink};

/// A sink's place in [`Routes`]: the key of one read's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkIndex(usize);

/// The delivery workers' place.
const WORKERS: SinkIndex = SinkIndex(0);

pub struct Routes {
    /// The delivery workers first, then each channel's own queue.
    sinks: Vec<Arc<dyn Sink>>,
    by_channel: HashMap<Channel, SinkIndex>,
}

impl Routes {
    /// `workers` for every configured channel without a queue of its own.
    pub fn new(workers: Arc<dyn Sink>, channels: &Channels) -> Self {
        let mut sinks = vec![workers];
        let mut by_channel = HashMap::new();
        for &channel in Channel::ALL.iter().filter(|c| channels.is_configured(**c)) {
            let index = match channels.sink(channel) {
                Some(own) => {
                    sinks.push(own.clone());
                    SinkIndex(sinks.len() - 1)
                }
                None => WORKERS,
            };
            by_channel.insert(channel, index);
        }
        Self { sinks, by_channel }
    }

    /// The sink of `channel`'s deliveries.
    pub fn of(&self, channel: Channel) -> SinkIndex {
        self.by_channel.get(&channel).copied().unwrap_or(WORKERS)
    }

    /// Opens one read's batch into `sink`.
    pub fn open(&self, sink: SinkIndex) -> Box<dyn Batch> {
        self.sinks[sink.0].open()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::channel::Provider as _;
    use crate::page::{Delivery, Handoff};
    use crate::testing::Scripted;

    /// Counts the batches opened into it.
    #[derive(Default)]
    struct Opened(AtomicUsize);

    impl Sink for Opened {
        fn open(&self) -> Box<dyn Batch> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::new(Nowhere)
        }
    }

    struct Nowhere;

    impl Batch for Nowhere {
        fn take(&mut self, _: Vec<Delivery>) -> Handoff {
            Box::pin(async { Ok(()) })
        }
    }

    #[test]
    fn every_configured_channel_has_a_sink_and_the_workers_are_the_default() {
        let (workers, queue) = (Arc::new(Opened::default()), Arc::new(Opened::default()));
        let mut channels = Channels::default();
        let provider = Scripted::new(Vec::new());
        let sent_by_workers = provider.channel();
        channels.insert(provider);
        channels.insert_sink(Channel::Relay, queue.clone());
        let routes = Routes::new(workers.clone(), &channels);

        assert_eq!(routes.of(sent_by_workers), WORKERS);
        let own = routes.of(Channel::Relay);
        assert_ne!(own, WORKERS, "a channel with its own queue");
        let gone = Channel::ALL.iter().find(|c| !channels.is_configured(**c)).expect("an unconfigured channel");
        assert_eq!(routes.of(*gone), WORKERS, "no longer configured: the workers settle it");

        drop(routes.open(own));
        drop(routes.open(routes.of(sent_by_workers)));
        assert_eq!((workers.0.load(Ordering::SeqCst), queue.0.load(Ordering::SeqCst)), (1, 1));
    }
}
