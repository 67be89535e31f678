//! In-process mock providers. Only the webhook receiver exists so far; APNs,
//! FCM and OAuth mocks will sit next to it.

pub mod webhook;

pub use webhook::{
    MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse, standard_webhooks_signature,
    verify_gim_signature, verify_standard_webhooks,
};
