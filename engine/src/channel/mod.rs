//! Channels: one provider client per channel behind the `Provider` trait, each
//! classifying the provider's answer into an `Outcome` (spec 000 section 7).

mod apns;
mod body;
mod fcm;
mod http2;
mod outcome;
mod tls;
mod webhook;

use std::sync::Arc;

use async_trait::async_trait;

pub use apns::{ApnsProvider, apns_body};
pub use body::webhook_body;
pub use fcm::{FcmProvider, fcm_body};
pub use outcome::Outcome;
pub use tls::client_tls_config;
pub use webhook::WebhookProvider;

use crate::domain::{Channel, StoredEnvelope};
use crate::store::Recipient;

/// One attempt's input: the envelope and the recipient as loaded for the window.
#[derive(Debug, Clone, Copy)]
pub struct Push<'a> {
    pub recipient: &'a Recipient,
    pub envelope: &'a StoredEnvelope,
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    fn channel(&self) -> Channel;

    /// Makes one attempt and classifies the answer. The caller bounds it to
    /// `ATTEMPT_TIMEOUT` and treats the timeout as transient.
    async fn send(&self, push: Push<'_>) -> Outcome;
}

/// The configured channels. A channel without a table is `None` (PUSH-210).
#[derive(Clone, Default)]
pub struct Channels {
    pub apns: Option<Arc<dyn Provider>>,
    pub fcm: Option<Arc<dyn Provider>>,
    pub http: Option<Arc<dyn Provider>>,
}

impl Channels {
    pub fn get(&self, channel: Channel) -> Option<&Arc<dyn Provider>> {
        match channel {
            Channel::Apns => self.apns.as_ref(),
            Channel::Fcm => self.fcm.as_ref(),
            Channel::Http => self.http.as_ref(),
        }
    }

    pub fn is_configured(&self, channel: Channel) -> bool {
        self.get(channel).is_some()
    }
}
