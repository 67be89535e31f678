//! A periodic cast to an actor (shard polls, lease rounds).

use std::time::Duration;

use ractor::{ActorRef, Message};
use tokio::task::JoinHandle;

/// Casts `message()` to `actor` every `every` (delaying, never bursting, after
/// a slow tick). Stops by itself when the actor is gone; the actor's
/// `post_stop` aborts it sooner.
pub(crate) fn spawn_ticker<M: Message>(actor: ActorRef<M>, every: Duration, message: fn() -> M) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if actor.cast(message()).is_err() {
                break;
            }
        }
    })
}
