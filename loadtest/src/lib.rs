//! Load harness and mock providers for fanout.
//!
//! - [`tls`]: a throwaway CA and server certificate ([`TestPki`]).
//! - [`mock`]: in-process mock receivers ([`MockWebhook`], [`MockApns`],
//!   [`MockFcm`]).

pub mod mock;
pub mod run;
pub mod tls;

pub use mock::apns::start as start_mock_apns;
pub use mock::fcm::start as start_mock_fcm;
pub use mock::webhook::start as start_mock_webhook;
pub use mock::{
    ApnsReply, ApnsTestKey, FcmReply, FcmServiceAccount, MockApns, MockApnsConfig, MockFcm, MockFcmConfig,
    ProviderRequest,
};
pub use mock::{MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse};
pub use tls::TestPki;
