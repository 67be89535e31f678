//! Test support for fanout, shared by the engine's unit tests, the end-to-end
//! tests and the load harness. Not production code: nothing here ships in
//! the `fanout` binary.
//!
//! - [`pki`]: a throwaway CA and server certificate ([`TestPki`]).
//! - [`mock`]: in-process mock providers ([`MockWebhook`], [`MockApns`],
//!   [`MockFcm`]).

pub mod mock;
pub mod pki;

pub use mock::apns::start as start_mock_apns;
pub use mock::fcm::start as start_mock_fcm;
pub use mock::webhook::start as start_mock_webhook;
pub use mock::{
    ApnsReply, ApnsTestKey, FcmReply, FcmServiceAccount, MockApns, MockApnsConfig, MockFcm, MockFcmConfig,
    ProviderRequest,
};
pub use mock::{MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse};
pub use pki::TestPki;
