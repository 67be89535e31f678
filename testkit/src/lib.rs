//! Test support for fanout, shared by the engine's unit tests, the end-to-end
//! tests and the load harness. Not production code: nothing here ships in
//! the `fanout` binary.
//!
//! - [`pki`]: a throwaway CA and server certificate ([`TestPki`]).
//! - [`mock`]: in-process mock providers ([`MockWebhook`], [`MockApns`],
//!   [`MockFcm`]), on the shared [`server`], [`recorder`] and [`request`].
//! - [`outage`]: provider outages a mock is switched into and out of
//!   ([`Outage`]: hang, refuse, TLS stall, slow, 503).
//! - [`launcher`]: the real `fanout` binary as a child process ([`Engine`]).
//! - [`wire`]: what HTTP/2 clients send, counted as a mock server reads it.
//! - [`webpush`]: a browser's side of Web Push (RFC 8291 decryption, RFC
//!   8292 VAPID checks).
//! - [`outside_service`]: the services a test needs from outside its
//!   process, named by `FANOUT_TEST_*` variables; a missing one fails the
//!   test under CI and is a visible skip elsewhere.

pub mod issuer;
pub mod launcher;
pub mod mock;
pub mod outage;
pub mod outside_service;
pub mod pki;
pub mod recorder;
pub mod request;
pub mod server;
#[cfg(test)]
mod test_client;
pub mod tls_client;
pub mod webpush;
pub mod wire;

use std::sync::{Mutex, MutexGuard};

pub use launcher::{Engine, Launch};
pub use mock::apns::start as start_mock_apns;
pub use mock::fcm::start as start_mock_fcm;
pub use mock::webhook::start as start_mock_webhook;
pub use mock::{AnswerBody, MockWebhook, MockWebhookConfig, ReceivedRequest, ScriptedResponse};
pub use mock::{
    ApnsReply, ApnsTestKey, FcmReply, FcmServiceAccount, MockApns, MockApnsConfig, MockFcm, MockFcmConfig,
    ProviderRequest,
};
pub use outage::{Outage, OutageKind};
pub use pki::TestPki;

/// Poison-tolerant lock: a panicking test thread must not wedge a mock.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
