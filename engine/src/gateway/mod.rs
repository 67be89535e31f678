//! Spec 002: the Arkret blind-wakeup push gateway. Two roles on
//! fanout's channels: the **Station** (devices register and unregister their
//! push route and get a pairwise `push_target_id`, §3) and the **Gateway**
//! (a Station asks for wake-ups with `notify`; fanout rebuilds a content-free
//! provider payload and delivers it over APNs/FCM, §5).
//!
//! The pure parts, one module per idea: `settings` (`[engine.gateway]`),
//! `grid` (the §5.1 count grid), `jcs` (RFC 8785), `identity` (pseudonyms,
//! fresh registration ids, collapse keys; the ids themselves are the
//! domain's), `schema` (closed bodies and headers), `outcome` (§5.2
//! answers and conservation), `egress` (the provider payload allow-list,
//! dedup, batching, hysteresis), `signature` (RFC 9421 / RFC 9530),
//! `pending` (the per-device bound behind `rate_limited`). The readings chosen where the spec is
//! ambiguous are listed in docs/GATEWAY.md ("Readings").

pub mod egress;
pub mod grid;
pub mod identity;
pub mod jcs;
pub mod outcome;
pub mod schema;
pub mod settings;
pub mod signature;

// The stateful parts (gw-state): the service and the wakeup worker.
pub mod delivery;
pub mod pending;
pub mod service;
mod state;

pub use self::egress::{DedupKey, Egress, EgressPolicy, ProviderWakeup, RateWindow, WakeupPayload};
pub use self::identity::{CollapseKey, DeliveryWindowId, PushSecret, SaltSecrets, SecretError};
pub use self::outcome::{DeviceOutcome, GatewayStatus, NoFanout, NotifyResponse, ReasonCode, Rejection, TargetFailure};
pub use self::schema::{
    NotifyHeaders, NotifyLimits, NotifyRequest, Operation, RegisterDevice, SchemaViolation, UnregisterDevice,
};
pub use self::settings::GatewaySettings;
pub use self::signature::{DigestError, SignatureError, SignaturePolicy, SignedRequest};
