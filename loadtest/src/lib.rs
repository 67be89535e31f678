//! Load harness and mock providers for fanout.
//!
//! - [`tls`]: a throwaway CA and server certificate ([`TestPki`]).
//! - [`mock`]: in-process mock receivers ([`MockWebhook`]).

pub mod mock;
pub mod tls;

pub use mock::webhook::start as start_mock_webhook;
pub use mock::{MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse};
pub use tls::TestPki;
