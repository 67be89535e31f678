//! A channel that exists in test builds only (its row in the channel table
//! is `#[cfg(test)]`), added exactly as a real one is: this folder and that
//! row. It sends nothing: each envelope delivery is recorded in the
//! context's `PushLog` ring and answered `Delivered`, so a test sees what
//! the delivery workers handed it (`delivery/worker.rs`).

mod settings;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use settings::ProbeSettings;

use crate::channel::push_log::{LoggedPush, PushLog};
use crate::channel::{BuildError, ChannelContext, Outcome, Provider, Push, Refusal};
use crate::domain::{Channel, DeliveryTarget, Timestamp};

pub struct ProbeProvider {
    log: Arc<PushLog>,
}

impl ProbeProvider {
    pub fn new(_settings: &ProbeSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        Ok(Self { log: ctx.push_log.clone() })
    }
}

#[async_trait]
impl Provider for ProbeProvider {
    fn channel(&self) -> Channel {
        Channel::Probe
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        // Its row says `relayed false`: a relayed push is refused unsent.
        let Push::Envelope { recipient, envelope } = push else {
            return Err(Refusal::Unsupported);
        };
        let DeliveryTarget::Probe { token } = &recipient.target else {
            return Ok(Outcome::Rejected);
        };
        let device = hex::encode(recipient.id.as_bytes());
        self.log.push(LoggedPush {
            user_id: device.clone(),
            device_id: device,
            token: token.clone(),
            payload: serde_json::json!({ "sequence_id": envelope.sequence_id }),
            sent_at: Timestamp::now().as_unix_nanos() / 1_000_000,
        });
        Ok(Outcome::Delivered)
    }

    fn timed_out(&self) -> Outcome {
        Outcome::transient(Duration::from_secs(1))
    }
}
