//! The destination guard (PUSH-256): connections go only to addresses
//! checked at that moment. No error or log line here names a URL, host,
//! address or key (PUSH-254).
//!
//! - `safety`: `DomainPattern` (allowed_domains), `WebhookPolicy::check`
//!   (resolve, then the address tables) and its typed error `SafetyError`.
//!   The URL's own rules (https, no userinfo, a valid host) are
//!   `domain::WebhookUrl`'s, checked when it is registered.
//! - `blocked`: the spec's blocked address table and the reserved classes
//!   beyond it (`AddressRules`).
//! - `resolve`: the `HostResolver` seam and `HickoryResolver`.
//! - `connect`: `CheckedResolver`, the resolver of the guarded connections,
//!   which re-applies the policy at every new connection.

mod blocked;
pub mod connect;
pub mod resolve;
pub mod safety;

pub use connect::CheckedResolver;
pub use resolve::{HickoryResolver, HostResolver, ResolveError};
pub use safety::{DomainPattern, SafetyError, WebhookPolicy, WebhookUrl};
