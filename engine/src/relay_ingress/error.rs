//! Why a webhook is not answered 2xx.

use super::request::Malformed;
use super::signature::SignatureError;
use strum::{IntoEnumIterator, VariantArray};

/// Why a webhook is not answered 2xx. `fanout-api` maps each to its status
/// once (`api/src/relay_ingress.rs`). Messages name the rule, never a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::EnumIter)]
pub enum IngressError {
    /// 401.
    #[error(transparent)]
    #[strum(disabled)]
    Signature(#[from] SignatureError),
    /// 401: no secret is configured for the body's hub_id.
    #[error("unknown hub")]
    UnknownHub,
    /// 400.
    #[error(transparent)]
    #[strum(disabled)]
    Malformed(#[from] Malformed),
    /// 413: over `max_body_bytes` (decided by the HTTP edge while reading).
    #[error("the body exceeds the configured limit")]
    BodyTooLarge,
    /// 422: a provider other than apns/fcm/webpush; the hub keeps the registration
    /// and drops the push (§2.4 "any other 4xx").
    #[error("this push server does not deliver to that provider")]
    UnsupportedProvider,
    /// 422: apns or fcm without its channel configured here.
    #[error("the provider's channel is not configured on this push server")]
    ProviderNotConfigured,
    /// 422: `app_id` not among `apns_app_ids` / `fcm_app_ids`.
    #[error("this push server does not deliver for that app_id")]
    UnknownApp,
    /// 413: over the platform's limit even without `mls_message` (§3).
    #[error("the payload exceeds the platform's limit")]
    PayloadTooLarge,
    /// 410: the provider declared the token dead (§2.4: the hub deletes
    /// the registration).
    #[error("the provider declared the registration's token dead")]
    DeadToken,
    /// 422: the provider refused this push for good (e.g. the token belongs
    /// to another app or environment); the registration is kept.
    #[error("the provider refused the push")]
    ProviderRejected,
    /// 429: `max_in_flight` webhooks are being handled.
    #[error("too many webhooks in flight")]
    Overloaded,
    /// 503: another request of the same delivery_id is being sent now.
    #[error("this delivery is being sent; retry")]
    InProgress { retry_after_secs: u64 },
    /// 503: the provider answered transiently or did not answer in time.
    #[error("the provider is unavailable; retry")]
    ProviderUnavailable { retry_after_secs: u64 },
    /// 503: the delivery records cannot be read or written.
    #[error("storage unavailable; retry")]
    Storage,
}

impl IngressError {
    /// The Retry-After of a 429 or 503, in seconds.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Overloaded | Self::Storage => Some(1),
            Self::InProgress { retry_after_secs } | Self::ProviderUnavailable { retry_after_secs } => {
                Some(*retry_after_secs)
            }
            _ => None,
        }
    }

    /// The `reason` label of `fanout_relay_ingress_rejected_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Signature(e) => e.label(),
            Self::UnknownHub => "unknown_hub",
            Self::Malformed(m) => m.label(),
            Self::BodyTooLarge => "body_too_large",
            Self::UnsupportedProvider => "unsupported_provider",
            Self::ProviderNotConfigured => "provider_not_configured",
            Self::UnknownApp => "unknown_app",
            Self::PayloadTooLarge => "payload_too_large",
            Self::DeadToken => "dead_token",
            Self::ProviderRejected => "provider_rejected",
            Self::Overloaded => "overloaded",
            Self::InProgress { .. } => "in_progress",
            Self::ProviderUnavailable { .. } => "provider_unavailable",
            Self::Storage => "storage",
        }
    }

    /// Every label value, so the series exist at zero.
    pub fn labels() -> impl Iterator<Item = &'static str> {
        let signature = SignatureError::VARIANTS.iter().map(|e| e.label());
        let malformed = Malformed::VARIANTS.iter().map(|m| m.label());
        signature.chain(malformed).chain(Self::iter().map(|e| e.label()))
    }
}
