//! In-process mock providers: the webhook receiver, APNs, FCM with its
//! OAuth2 token endpoint, and a Web Push service. Each holds only its
//! protocol; the TLS server, the
//! request recorder and request parsing are shared ([`crate::server`],
//! [`crate::recorder`], [`crate::request`]).

pub mod apns;
pub mod fcm;
pub mod provider;
pub mod webhook;
pub mod webpush;

pub use apns::{ApnsReply, ApnsTestKey, MockApns, MockApnsConfig};
pub use fcm::{FcmReply, FcmServiceAccount, MockFcm, MockFcmConfig};
pub use provider::ProviderRequest;
pub use webhook::{
    AnswerBody, MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse, standard_webhooks_signature,
    verify_gim_signature, verify_standard_webhooks,
};
