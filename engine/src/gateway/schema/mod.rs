//! The closed JSON bodies and the headers of spec 002's three operations,
//! parsed into typed requests (§3.1 register-device, §3.2 unregister-device,
//! §5.1 notify). Anything the tables do not define is refused with
//! `schema_violation`, naming where and which rule, never the value.
//!
//! One module per part, so each reads alone: the headers, the strict JSON
//! reader, the register/unregister bodies and notify's. The violation they
//! all report is here; callers name everything through this module.

use std::fmt;

mod headers;
mod notify;
mod register;
mod strict_json;

pub use self::headers::{
    HEADER_DESTINATION_SERVICE, HEADER_IDEMPOTENCY_KEY, HEADER_OPERATION, HEADER_SOURCE_SERVICE, NotifyHeaders,
    Operation, check_operation,
};
pub use self::notify::{
    AuditEnvelope, CallerReason, CountValue, Counts, Devices, L10nKey, Notification, NotifyLimits, NotifyRequest,
    PushHint, RequestDigest, RouteTokens, WakeupKind, is_event_kind,
};
pub use self::register::{Platform, PushKey, RegisterDevice, UnregisterDevice};

/// Where a violation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A JSON pointer into the body ("" is the whole body).
    Body(String),
    /// A header, by its canonical name.
    Header(&'static str),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Body(p) if p.is_empty() => f.write_str("the body"),
            Self::Body(p) => write!(f, "body {p}"),
            Self::Header(h) => write!(f, "header {h}"),
        }
    }
}

/// Which rule a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    #[error("the body is not a single JSON value")]
    NotJson,
    #[error("a member name is repeated")]
    DuplicateMember,
    #[error("must be a JSON object")]
    NotObject,
    #[error("is required")]
    Missing,
    #[error("is not a field of this operation")]
    UnknownField,
    #[error("is forbidden in every push request (content, payloads, provider fields, rules, timing hints)")]
    ForbiddenField,
    #[error("is a visible-notification field; this gateway serves the blind_wakeup profile only")]
    VisibleOnlyField,
    #[error("is a service header and must not be carried in the body")]
    ServiceHeaderInBody,
    #[error("the account comes from the authenticated session, never the body")]
    AccountInBody,
    #[error("a device item carries device_id only; routes come from the registration")]
    RoutingFieldInDevice,
    #[error("must be a string")]
    NotString,
    #[error("must be a boolean")]
    NotBool,
    #[error("must be an array")]
    NotArray,
    #[error("is not one of the allowed values")]
    NotInEnum,
    #[error("is too long or holds characters outside the allowed set")]
    BadText,
    #[error("push_target_id must be \"ak:pseudonym:push:\" and the canonical unpadded base64url of 32 octets")]
    BadPushTargetId,
    #[error("device_id must be \"ak:device:\" and a lowercase UUIDv7")]
    BadDeviceId,
    #[error("push_hint_l10n_key is present exactly when push_hint is \"l10n_key\"")]
    L10nKeyPairing,
    #[error("must be a boolean or a bucket of the grid, never an absolute count")]
    AbsoluteCount,
    #[error("is not a bucket of the grid")]
    BucketNotInGrid,
    #[error("must be a whole number from 1 to the configured maximum")]
    IncrementOutOfRange,
    #[error("must name at least one device")]
    NoDevices,
    #[error("names more devices than this gateway accepts in one request")]
    TooManyDevices,
    #[error("names a device twice")]
    DuplicateDevice,
    #[error(
        "push_key names no provider this gateway delivers (prefix fcm:, apns:, apns-sandbox:, or platform android/ios)"
    )]
    UnroutablePushKey,
    #[error("is required")]
    MissingHeader,
    #[error("must appear once")]
    RepeatedHeader,
    #[error("does not select this operation")]
    WrongOperation,
    #[error("must be 1 to 255 visible ASCII characters")]
    BadHeaderValue,
}

/// `schema_violation` (§5.1): the request is refused whole and changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {rule}")]
pub struct SchemaViolation {
    pub at: Location,
    pub rule: Rule,
}

impl SchemaViolation {
    /// The problem code of every such refusal.
    pub const CODE: &'static str = "schema_violation";

    fn body(pointer: impl Into<String>, rule: Rule) -> Self {
        Self { at: Location::Body(pointer.into()), rule }
    }

    fn header(name: &'static str, rule: Rule) -> Self {
        Self { at: Location::Header(name), rule }
    }
}

type Result<T> = std::result::Result<T, SchemaViolation>;
