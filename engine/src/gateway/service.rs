//! Spec 002's two roles on one shared, authoritative registration store
//! (§3.3's first delivery path: "同一受信部署中的 Station 与 Gateway 访问同一
//! 权威耐久注册状态"): the **Station** registers and revokes device routes
//! for authenticated accounts (§3.1–3.2), the **Gateway** answers notify
//! (§5) and hands accepted wakeups to `delivery`.
//!
//! Every request takes a slot among `max_in_flight` (else `Overloaded`): the
//! work per request is bounded (devices per notify, one store transaction per
//! step), so the slots bound the store and memory load.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::delivery::{Delivery, route_channel};
use super::identity::{AccountId, PushTargetId, RegistrationId, SaltSecrets, SecretError, ServiceId};
use super::schema::{RegisterDevice, UnregisterDevice};
use super::settings::GatewaySettings;
use crate::channel::Channels;
use crate::clock::unix_now_ns;
use crate::store::{GatewayRegistration, Revoke, RouteKey, Store};

/// Requests handled at once by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

fn now_ms() -> i64 {
    unix_now_ns() / 1_000_000
}

/// §3.1's answer.
#[derive(Clone, PartialEq, Eq)]
pub struct Registered {
    pub push_target_id: PushTargetId,
    pub registration_id: RegistrationId,
    pub expires_at_ms: i64,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered").field("expires_at_ms", &self.expires_at_ms).finish_non_exhaustive()
    }
}

impl Registered {
    /// The 2xx body: `push_target_id`, `registration_id`, `expires_at`
    /// (RFC 3339, UTC, whole seconds).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "push_target_id": self.push_target_id.to_string(),
            "registration_id": self.registration_id.as_str(),
            "expires_at": rfc3339(self.expires_at_ms),
        })
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time in ms (proleptic Gregorian, UTC).
pub fn rfc3339(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Why a Station request is refused. Messages name the rule, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StationError {
    /// 400 `schema_violation`.
    #[error(transparent)]
    Schema(#[from] super::schema::SchemaViolation),
    /// 422: §3.3 "仅填写 push_gateway_url 不建立信任": the URL is not,
    /// byte for byte, an onboarded gateway that shares this store (a remote
    /// gateway would need §3.4's handoff, which fanout does not offer).
    #[error("push_gateway_url does not name a gateway onboarded with this Station")]
    GatewayNotOnboarded,
    /// 422: the push key's provider (APNs or FCM) is not configured here.
    #[error("the push key's provider is not configured on this gateway")]
    RouteNotConfigured,
    /// 429.
    #[error("too many requests in flight")]
    Overloaded,
    /// 503.
    #[error("storage unavailable; retry")]
    Storage,
}

impl StationError {
    /// The stable problem code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Schema(_) => super::schema::SchemaViolation::CODE,
            Self::GatewayNotOnboarded => "push_gateway_not_onboarded",
            Self::RouteNotConfigured => "push_route_not_configured",
            Self::Overloaded => "rate_limited",
            Self::Storage => "unavailable",
        }
    }
}

/// Both roles: built once from `[engine.gateway]`, shared by every request.
pub struct GatewayService {
    settings: GatewaySettings,
    secrets: SaltSecrets,
    store: Arc<dyn Store>,
    channels: Channels,
    delivery: Delivery,
    in_flight: Arc<Semaphore>,
}

impl GatewayService {
    /// Reads the salt secrets. Fails on an unreadable or invalid file.
    pub fn new(
        settings: GatewaySettings,
        store: Arc<dyn Store>,
        channels: Channels,
        delivery: Delivery,
        max_in_flight: usize,
    ) -> Result<Self, SecretError> {
        let secrets = SaltSecrets::load(&settings.salt_epoch, settings.salt_secret_files())?;
        Ok(Self { settings, secrets, store, channels, delivery, in_flight: Arc::new(Semaphore::new(max_in_flight)) })
    }

    pub fn settings(&self) -> &GatewaySettings {
        &self.settings
    }

    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().ok()
    }

    /// §3.1 for `account` of the Station whose notifying service is `tenant`:
    /// derives the pseudonym under the current salt epoch, stores the route
    /// with a fresh registration_id, atomically superseding the device's
    /// previous one, and answers once it is stored.
    pub async fn register(
        &self,
        tenant: &ServiceId,
        account: &AccountId,
        request: &RegisterDevice,
    ) -> Result<Registered, StationError> {
        let _slot = self.slot().ok_or(StationError::Overloaded)?;
        let gateway =
            self.settings.gateway_for_url(&request.push_gateway_url).ok_or(StationError::GatewayNotOnboarded)?;
        if gateway.service_id != self.settings.service_id {
            return Err(StationError::GatewayNotOnboarded);
        }
        let route = request.push_key.route();
        if !self.channels.is_configured(route_channel(route).0) {
            return Err(StationError::RouteNotConfigured);
        }
        let epoch = self.secrets.current_epoch();
        let push_target_id = PushTargetId::derive(self.secrets.current(), epoch, account, &request.device_id, route);
        let registration_id = RegistrationId::generate();
        let now = now_ms();
        let expires_at_ms = now.saturating_add(self.settings.registration_ttl.as_millis() as i64);
        let registration = GatewayRegistration {
            tenant: tenant.as_str().to_owned(),
            account_id: account.as_str().to_owned(),
            device_id: request.device_id.as_str().to_owned(),
            registration_id: registration_id.as_str().to_owned(),
            push_target_id: push_target_id.to_string(),
            push_route_id: route.as_str().to_owned(),
            salt_epoch_id: epoch.as_str().to_owned(),
            push_key: request.push_key.as_registered().to_owned(),
            platform: request.platform.map(|p| p.as_str().to_owned()),
            app_id: request.app_id.clone(),
            visible_opt_in: request.visible_notification_opt_in,
            created_at_ms: now,
            expires_at_ms,
            token_invalid: false,
        };
        self.store.gateway_register(&registration).await.map_err(|_| StationError::Storage)?;
        Ok(Registered { push_target_id, registration_id, expires_at_ms })
    }

    /// §3.2: revokes the device's current route (narrowed by push_key and
    /// app_id when given). Success also when nothing was registered; the
    /// revoke is committed before the answer.
    pub async fn unregister(
        &self,
        tenant: &ServiceId,
        account: &AccountId,
        request: &UnregisterDevice,
    ) -> Result<(), StationError> {
        let _slot = self.slot().ok_or(StationError::Overloaded)?;
        let revoke = Revoke {
            route: RouteKey {
                tenant: tenant.as_str().to_owned(),
                account_id: account.as_str().to_owned(),
                device_id: request.device_id.as_str().to_owned(),
            },
            push_key: request.push_key.clone(),
            app_id: request.app_id.clone(),
        };
        self.store.gateway_unregister(&revoke).await.map_err(|_| StationError::Storage)?;
        Ok(())
    }

    /// The registration lease of a notify claim: three attempt bounds.
    pub const CLAIM_LEASE: Duration = Duration::from_secs(30);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_555_296_789), "2025-12-01T02:14:56Z");
        assert_eq!(rfc3339(4_102_444_799_000), "2099-12-31T23:59:59Z");
    }
}
