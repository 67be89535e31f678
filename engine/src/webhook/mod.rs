//! Webhook destinations: safety of a URL and its addresses (PUSH-256), DNS
//! resolution, and Standard Webhooks signing (PUSH-235).
//!
//! - `safety`: `WebhookUrl` (https, no userinfo, a valid host),
//!   `DomainPattern` (allowed_domains), `WebhookPolicy::check` (resolve, then
//!   the blocked address table), `is_blocked`.
//! - `resolve`: the `HostResolver` seam and `HickoryResolver`.
//! - `connect`: `CheckedResolver`, the hyper-util `HttpConnector` resolver
//!   that re-applies the policy at every new connection.
//! - `signing`: the three PUSH-235 headers.
//!
//! The channel calls `WebhookPolicy::check` before every attempt (this also
//! covers IP-literal hosts, which `HttpConnector` connects to without calling
//! its resolver), and connects through `CheckedResolver`. No error or log line
//! here names a URL, host, address or key (PUSH-254).

pub mod connect;
pub mod resolve;
pub mod safety;
pub mod signing;

pub use connect::CheckedResolver;
pub use resolve::{HickoryResolver, HostResolver, ResolveError};
pub use safety::{DomainPattern, SafetyError, WebhookPolicy, WebhookUrl, is_blocked};
pub use signing::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, WebhookHeaders, new_webhook_id, sign};
