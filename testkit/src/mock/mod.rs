//! In-process mock providers: the webhook receiver, APNs, and FCM with its
//! OAuth2 token endpoint.

pub mod apns;
pub mod fcm;
pub mod webhook;

pub use apns::{ApnsReply, ApnsTestKey, MockApns, MockApnsConfig, ProviderRequest};
pub use fcm::{FcmReply, FcmServiceAccount, MockFcm, MockFcmConfig};

pub use webhook::{
    MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse, standard_webhooks_signature,
    verify_gim_signature, verify_standard_webhooks,
};
