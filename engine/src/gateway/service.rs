//! Spec 002's two roles on one shared, authoritative registration store
//! (§3.3's first delivery path: "同一受信部署中的 Station 与 Gateway 访问同一
//! 权威耐久注册状态"): the **Station** registers and revokes device routes
//! for authenticated accounts (§3.1–3.2), the **Gateway** answers notify
//! (§5) and hands accepted wakeups to `delivery`.
//!
//! Every request takes a slot among `max_in_flight` (else `Overloaded`): the
//! work per request is bounded (devices per notify, one store transaction per
//! step), so the slots bound the store and memory load.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use strum::VariantArray;
use tokio::sync::Semaphore;

use super::delivery::{Delivery, route_channel};
use super::egress::{
    BucketDwell, DedupKey, DedupScope, Egress, EgressCount, ProviderWakeup, RateWindow, WakeupPayload,
};
use super::identity::{DeliveryWindowId, SaltSecrets};
use super::outcome::{DeviceOutcome, GatewayStatus, NoFanout, NotifyResponse, ReasonCode, Rejection, TargetFailure};
use super::pending::{Admission, PendingWakeups, ledger_key};
use super::schema::{NotifyHeaders, NotifyRequest, RegisterDevice, SchemaViolation, UnregisterDevice};
use super::settings::GatewaySettings;
use super::state::{batch_id, hex32, update_ledger, update_state};
use crate::channel::Channels;
use crate::domain::{
    AccountId, Clock, DeviceId, GatewayRegistration, GatewayWakeup, NotifyClaim, NotifyKey, PushTargetId,
    RegistrationId, Revoke, RouteKey, ServiceId, Timestamp,
};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// Requests handled at once by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

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

/// What a Station request changed, as `fanout_gateway_registrations_total`
/// counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum StationChange {
    /// A device's first current route (or its previous one had expired).
    Registered,
    /// A new route replaced the device's current one (§3.1 supersede).
    Superseded,
    /// §3.2: the current route was deleted.
    Revoked,
    /// §3.2: nothing matched (204 all the same).
    NotRegistered,
}

impl StationChange {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The gateway's labelled families at zero, every value (docs/METRICS.md),
/// so that rates and alerts see them before the first event.
fn initialise_metrics(metrics: &Metrics) {
    let g = &metrics.gateway;
    for status in GatewayStatus::VARIANTS {
        g.device_outcomes.with_label_values(&[status.as_str()]);
    }
    for reason in ReasonCode::VARIANTS {
        g.device_rejections.with_label_values(&[reason.as_str()]);
    }
    for change in StationChange::VARIANTS {
        g.registrations.with_label_values(&[change.as_str()]);
    }
    for sent in super::delivery::Sent::VARIANTS {
        g.wakeups.with_label_values(&[sent.as_str()]);
    }
}

/// Both roles: built once from `[engine.gateway]`, shared by every request.
pub struct GatewayService {
    settings: GatewaySettings,
    secrets: Arc<SaltSecrets>,
    store: Arc<dyn Store>,
    channels: Channels,
    delivery: Delivery,
    in_flight: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// The time the rules run on (registration expiry, claim leases,
    /// windows, dwell).
    clock: Arc<dyn Clock>,
}

impl GatewayService {
    /// `secrets` as `SaltSecrets::load` read them from the settings' files;
    /// the delivery worker holds the same ones (its collapse keys) and the
    /// clock both run on.
    pub fn new(
        settings: GatewaySettings,
        secrets: Arc<SaltSecrets>,
        store: Arc<dyn Store>,
        channels: Channels,
        delivery: Delivery,
        max_in_flight: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        initialise_metrics(&metrics);
        let in_flight = Arc::new(Semaphore::new(max_in_flight));
        let clock = delivery.clock();
        Self { settings, secrets, store, channels, delivery, in_flight, metrics, clock }
    }

    /// Now, on the gateway's clock: what a notify's signature freshness
    /// (§5, RFC 9421 `created`) is checked against.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
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
        let now = self.clock.now_ms();
        let expires_at_ms = now.saturating_add(self.settings.registration_ttl.as_millis() as i64);
        let registration = GatewayRegistration {
            tenant: tenant.clone(),
            account_id: account.clone(),
            device_id: request.device_id.clone(),
            registration_id: registration_id.clone(),
            push_target_id,
            push_route_id: route,
            salt_epoch_id: epoch.clone(),
            push_key: request.push_key.as_registered().to_owned(),
            platform: request.platform.map(|p| p.as_str().to_owned()),
            app_id: request.app_id.clone(),
            visible_opt_in: request.visible_notification_opt_in,
            created_at_ms: now,
            expires_at_ms,
            token_invalid: false,
        };
        let superseded = self.store.gateway().register(&registration).await.map_err(|_| StationError::Storage)?;
        let change = if superseded.is_some() { StationChange::Superseded } else { StationChange::Registered };
        self.metrics.gateway.registrations.with_label_values(&[change.as_str()]).inc();
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
                tenant: tenant.clone(),
                account_id: account.clone(),
                device_id: request.device_id.clone(),
            },
            push_key: request.push_key.clone(),
            app_id: request.app_id.clone(),
        };
        let revoked = self.store.gateway().unregister(&revoke).await.map_err(|_| StationError::Storage)?;
        let change = if revoked { StationChange::Revoked } else { StationChange::NotRegistered };
        self.metrics.gateway.registrations.with_label_values(&[change.as_str()]).inc();
        Ok(())
    }

    /// §5: one notify from `headers.source`, whose signature the HTTP edge
    /// verified over these headers and the raw body. In order: the
    /// destination is this gateway; the body's closed schema; the
    /// Idempotency-Key (an exact replay gets the stored answer, another body
    /// `duplicate_conflict`); the no-fanout branches; the target in the
    /// source's tenant; the rebuilt payload's size; then per device its
    /// registration, dedup, rate and bucket dwell. The answer and its
    /// wakeups are stored in one step before it is returned (`accepted` is
    /// a durable takeover), and the wakeup worker is nudged.
    pub async fn notify(&self, headers: &NotifyHeaders, body: &[u8]) -> Result<Vec<u8>, NotifyError> {
        let _slot = self.slot().ok_or(NotifyError::Overloaded)?;
        if headers.destination != self.settings.service_id {
            return Err(NotifyError::WrongDestination);
        }
        if self.settings.source_service(&headers.source).is_none() {
            return Err(NotifyError::UnknownSource);
        }
        let request = NotifyRequest::parse(body, &self.settings.notify_limits())?;
        let key = NotifyKey { tenant: headers.source.clone(), idempotency_key: headers.idempotency_key.clone() };
        let now = self.clock.now_ms();
        let lease_until = now + CLAIM_LEASE.as_millis() as i64;
        let expires_at = now.saturating_add(self.settings.idempotency_retention.as_millis() as i64);
        let claim = self.store.gateway().notify_claim(&key, &request.digest.0, now, lease_until, expires_at).await?;
        match claim {
            NotifyClaim::Claimed => {}
            NotifyClaim::Replay(response) => return Ok(response),
            NotifyClaim::Conflict => return Err(NotifyError::DuplicateConflict),
            NotifyClaim::Busy { .. } => return Err(NotifyError::InProgress),
        }
        // This request, as distinct from another with the same body under
        // another key (§2.4 dedup must see those as two).
        let owner: [u8; 32] = Sha256::new()
            .chain_update(headers.idempotency_key.as_str().as_bytes())
            .chain_update(request.digest.0)
            .finalize()
            .into();
        let decided = self.decide(&headers.source, &request, &owner, now).await;
        let (response, wakeups) = match decided {
            Ok(d) => d,
            Err(e) => {
                let _ = self.store.gateway().notify_release(&key, lease_until).await;
                return Err(e.into());
            }
        };
        let body = response.to_json();
        if !self.store.gateway().notify_commit(&key, lease_until, &body, &wakeups, expires_at).await? {
            // Our claim ran out and another request took it over: its
            // answer stands; this caller retries and gets it. (Its wakeups
            // have this request's ids, so the ledger entries are its.)
            return Err(NotifyError::InProgress);
        }
        if !wakeups.is_empty() {
            self.delivery.nudge();
        }
        self.count(&response);
        Ok(body)
    }

    /// Counts a decided answer's outcomes (a replay is not counted again).
    fn count(&self, response: &NotifyResponse) {
        let g = &self.metrics.gateway;
        for outcome in response.outcomes() {
            g.device_outcomes.with_label_values(&[outcome.gateway_status.as_str()]).inc();
            if let Some(reason) = outcome.reason_code {
                g.device_rejections.with_label_values(&[reason.as_str()]).inc();
            }
        }
    }

    /// The answer and the wakeups to store with it.
    async fn decide(
        &self,
        source: &ServiceId,
        request: &NotifyRequest,
        owner: &[u8; 32],
        now: i64,
    ) -> Result<(NotifyResponse, Vec<GatewayWakeup>), StoreError> {
        let n = &request.notification;
        let target = n.push_target_id;
        if let Some(branch) = NoFanout::of(request, &self.settings.no_fanout_event_kinds) {
            if branch == NoFanout::Audit {
                // The audit pipeline's record: the event's class only, no id.
                let kind = request.audit_envelope.as_ref().map(|a| a.access_kind.as_str());
                tracing::info!(target: "fanout::gateway::audit", access_kind = kind, "audit envelope received");
            }
            return Ok((NotifyResponse::no_fanout(target, &n.devices), Vec::new()));
        }
        // Registrations of a retired salt epoch no longer resolve (§2.2).
        let registrations: Vec<_> = self
            .store
            .gateway()
            .target(source, &target, now)
            .await?
            .into_iter()
            .filter(|r| self.secrets.get(&r.salt_epoch_id).is_some())
            .collect();
        if registrations.is_empty() {
            return Ok((NotifyResponse::whole_target(target, &n.devices, TargetFailure::Unknown), Vec::new()));
        }
        let payload = WakeupPayload::rebuild(n, &self.settings.count_grid);
        if payload.encoded_len() > self.settings.max_provider_payload_bytes {
            return Ok((NotifyResponse::whole_target(target, &n.devices, TargetFailure::PayloadTooLarge), Vec::new()));
        }
        let mut outcomes = HashMap::new();
        let mut wakeups = Vec::new();
        for device in n.devices.iter() {
            let registration = registrations.iter().find(|r| r.device_id == *device);
            let outcome = match registration {
                None => DeviceOutcome::Rejected(Rejection::terminal(ReasonCode::PushTokenUnknown)),
                Some(r) if r.token_invalid => {
                    DeviceOutcome::Rejected(Rejection::terminal(ReasonCode::PushTokenInvalid))
                }
                Some(r) => {
                    let this = Request { source, request, owner };
                    self.take_over(this, r, device, payload.clone(), now, &mut wakeups).await?
                }
            };
            outcomes.insert(device.clone(), outcome);
        }
        let response = NotifyResponse::per_device(target, &n.devices, |d| outcomes[d]);
        Ok((response, wakeups))
    }

    /// One registered device: dedup, rate and bucket dwell, and the wakeup.
    async fn take_over(
        &self,
        Request { source, request, owner }: Request<'_>,
        reg: &GatewayRegistration,
        device: &DeviceId,
        mut payload: WakeupPayload,
        now: i64,
        wakeups: &mut Vec<GatewayWakeup>,
    ) -> Result<DeviceOutcome, StoreError> {
        let (tenant, route, epoch, account) = (source, reg.push_route_id, &reg.salt_epoch_id, &reg.account_id);
        if !self.channels.is_configured(route_channel(route).0) {
            // The operator removed the provider: retryable once it is back.
            let rejection = Rejection::retry(ReasonCode::PushGatewayUnreachable, Duration::from_secs(60));
            return Ok(DeviceOutcome::Rejected(rejection.expect("retryable")));
        }
        let secret = self.secrets.get(epoch).expect("filtered to known epochs");
        let window_secs = self.settings.window.as_secs().max(1);
        let now_u = now.max(0) as u64;
        let window = DeliveryWindowId::at(now_u, window_secs);
        let window_end = window.end_ms(window_secs) as i64;

        // §2.4: one wakeup per (account, device, route, source event) per
        // window. The marker holds the request's `owner`, so a take-over of
        // this very request (its claim's holder died) is not a duplicate.
        let scope = DedupScope { account, device, route, epoch, source_event: &request.wakeup_digest };
        let dedup = DedupKey::derive(secret, scope, window);
        let marker = [b"d".as_slice(), dedup.as_bytes()].concat();
        let taken_by_other = |held: Option<Vec<u8>>| held.is_some_and(|h| h != owner[..]);
        if taken_by_other(self.store.gateway().state(tenant, &marker, now).await?) {
            return Ok(DeviceOutcome::Duplicate);
        }

        // §5.2 `rate_limited` (reading 26): at the device's bound of
        // unfinished wakeups nothing more is stored for it; checked before
        // the dedup marker is taken, so the caller's retry is not its own
        // duplicate. This request's own wakeup (decided again after a lost
        // claim) is already counted.
        let ledger = ledger_key(&reg.account_id, &reg.device_id);
        let pending: PendingWakeups = self.read_state(tenant, &ledger, now).await?;
        let own_id = now_wakeup_id(tenant, owner, device);
        let bound = self.settings.max_pending_wakeups_per_device;
        if let Admission::Full { retry_after } = pending.admit(&own_id, bound, now) {
            let rejection = Rejection::retry(ReasonCode::RateLimited, retry_after).expect("retryable");
            return Ok(DeviceOutcome::Rejected(rejection));
        }

        let keep = window_end + self.settings.window.as_millis() as i64;
        if !self.store.gateway().state_cas(tenant, &marker, None, owner, now, keep).await?
            && taken_by_other(self.store.gateway().state(tenant, &marker, now).await?)
        {
            return Ok(DeviceOutcome::Duplicate);
        }

        let route_key = route_state_key(reg);
        // §5.1: a bucket badge keeps its bucket for the dwell.
        if let Some(EgressCount::Bucket(label)) = payload.counts().badge.clone() {
            let dwell = self.settings.count_dwell;
            let keep = now + 2 * dwell.as_millis() as i64 + 1;
            let shown = self
                .update_state(tenant, &[b"c".as_slice(), &route_key].concat(), keep, now, |d: &mut BucketDwell| {
                    d.observe(&label, dwell, now_u)
                })
                .await?;
            payload.set_badge(Some(EgressCount::Bucket(shown)));
        }

        // §4.5 / §8: at once up to the threshold per window, else (or on a
        // hardened route always) one batch wakeup at the bucket's end.
        let policy = self.settings.egress_policy(source);
        let keep = window_end + self.settings.window.as_millis() as i64;
        let egress = self
            .update_state(tenant, &[b"r".as_slice(), &route_key].concat(), keep, now, |r: &mut RateWindow| {
                r.admit(&policy, now_u)
            })
            .await?;
        let expires_at_ms = now + WAKEUP_LIFETIME.as_millis() as i64;
        let wakeup = match egress {
            Egress::Now => {
                let sent = ProviderWakeup::new(payload, secret, window);
                self.wakeup(reg, own_id, sent, now, expires_at_ms)
            }
            Egress::Batch { flush_at_ms } => {
                let id = batch_id(tenant, &route_key, flush_at_ms);
                let flush_window = DeliveryWindowId::at(flush_at_ms, window_secs);
                // Held wakeups of the bucket merge into one (§4.5).
                let keep = flush_at_ms as i64 + WAKEUP_LIFETIME.as_millis() as i64;
                let max = self.settings.max_unread_increment;
                let merged = self
                    .update_state(tenant, id.as_bytes(), keep, now, |held: &mut Option<WakeupPayload>| {
                        let next = match held.take() {
                            Some(h) => h.merge(payload.clone(), max),
                            None => unresolved(&payload),
                        };
                        *held = Some(next.clone());
                        next
                    })
                    .await?;
                let sent = ProviderWakeup::new(merged, secret, flush_window);
                self.wakeup(reg, id, sent, flush_at_ms as i64, expires_at_ms.max(keep))
            }
        };
        // The ledger lists it before the answer commits it: a commit that
        // never happens leaves an entry until this request is retried
        // (same id) or the entry expires (docs/GATEWAY.md "Known limits").
        let (id, next, expires) = (wakeup.id.clone(), wakeup.not_before_ms, wakeup.expires_at_ms);
        update_ledger(self.store.as_ref(), tenant, &ledger, now, |l| l.add(&id, next, expires, now)).await?;
        wakeups.push(wakeup);
        Ok(DeviceOutcome::Accepted)
    }

    fn wakeup(
        &self,
        reg: &GatewayRegistration,
        id: String,
        sent: ProviderWakeup,
        not_before_ms: i64,
        expires_at_ms: i64,
    ) -> GatewayWakeup {
        GatewayWakeup {
            id,
            route: reg.route_key(),
            registration_id: reg.registration_id.clone(),
            payload: serde_json::to_vec(&sent.payload).expect("a payload serializes"),
            collapse_key: sent.collapse_key.as_str().to_owned(),
            not_before_ms,
            attempts: 0,
            expires_at_ms,
        }
    }

    /// A window state value, or its default when absent or unreadable.
    async fn read_state<T: DeserializeOwned + Default>(
        &self,
        tenant: &ServiceId,
        key: &[u8],
        now: i64,
    ) -> Result<T, StoreError> {
        let held = self.store.gateway().state(tenant, key, now).await?;
        Ok(held.as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default())
    }

    /// Read-modify-write of a window state value by compare-and-set, tried
    /// again when another request changed it in between.
    async fn update_state<T, R>(
        &self,
        tenant: &ServiceId,
        key: &[u8],
        expires_at_ms: i64,
        now: i64,
        change: impl FnMut(&mut T) -> R,
    ) -> Result<R, StoreError>
    where
        T: Serialize + DeserializeOwned + Default,
    {
        update_state(self.store.as_ref(), tenant, key, |_: &T| expires_at_ms, now, change).await
    }
}

/// The id of the wakeup a request stores for a device at once: the same for
/// the same request (Idempotency-Key and body), so a request decided again
/// stores, and lists, the same wakeup.
fn now_wakeup_id(tenant: &ServiceId, owner: &[u8; 32], device: &DeviceId) -> String {
    hex32(&[tenant.as_str().as_bytes(), owner.as_slice(), device.as_str().as_bytes()])
}

/// §4.5: a batch wakeup carries `evaluation_locus_unresolved = true`.
fn unresolved(payload: &WakeupPayload) -> WakeupPayload {
    let mut value = serde_json::to_value(payload).expect("a payload serializes");
    value["evaluation_locus_unresolved"] = serde_json::Value::Bool(true);
    serde_json::from_value(value).expect("the same payload, flagged")
}

/// One notify as `take_over` sees it.
#[derive(Clone, Copy)]
struct Request<'a> {
    source: &'a ServiceId,
    request: &'a NotifyRequest,
    /// SHA-256 of the Idempotency-Key and the body digest.
    owner: &'a [u8; 32],
}

/// A notify claim's lease: three attempt bounds.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// How long an accepted wakeup is tried before it is given up.
pub const WAKEUP_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The state key of a device route (account, device, route), hashed so
/// that no stored key spells an account or device id.
fn route_state_key(reg: &GatewayRegistration) -> Vec<u8> {
    let mut h = Sha256::new();
    for part in [reg.account_id.as_str(), reg.device_id.as_str(), reg.push_route_id.as_str()] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_vec()
}

/// Why a notify is not answered 200. Each maps to one status at the HTTP
/// edge; messages name the rule, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyError {
    /// 400 `schema_violation`.
    #[error(transparent)]
    Schema(#[from] SchemaViolation),
    /// 401: no `[[engine.gateway.source_services]]` entry for the source.
    #[error("Source-Service-ID is not a service allowed to notify")]
    UnknownSource,
    /// 421: `Destination-Service-ID` is not this gateway.
    #[error("Destination-Service-ID does not name this gateway")]
    WrongDestination,
    /// 409 `duplicate_conflict` (§5.2).
    #[error("Idempotency-Key was used with another body")]
    DuplicateConflict,
    /// 503 + Retry-After: the same request is being handled now.
    #[error("this request is being handled; retry")]
    InProgress,
    /// 429.
    #[error("too many requests in flight")]
    Overloaded,
    /// 503 + Retry-After.
    #[error("storage unavailable; retry")]
    Storage,
}

impl From<StoreError> for NotifyError {
    fn from(e: StoreError) -> Self {
        // The caller is told only to retry; the operator sees why.
        tracing::warn!(target: "fanout::gateway", error = %e, "a notify's storage step failed");
        Self::Storage
    }
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

    /// The rules of `register` and `notify` on a controlled clock, with a
    /// threshold of 2 wake-ups per 60 s window and a dwell of 120 s.
    mod rules {
        use serde_json::{Value, json};

        use super::*;
        use crate::domain::IdempotencyKey;
        use crate::gateway::delivery::DeliverySettings;
        use crate::gateway::egress::CollapseKeys;
        use crate::gateway::state::held_batch;
        use crate::store::RedbStore;
        use crate::testing::{Scripted, TestClock, salt_secrets};

        const GATEWAY: &str = "did:web:push.example";
        const STATION: &str = "did:web:station.example";
        const URL: &str = "https://push.example/_arkret/edge/push/notify";
        const DEVICE: &str = "ak:device:01964137-0000-7000-8000-000000000000";
        /// A window's start: 2026-01-01T00:00:00Z.
        const T0: i64 = 1_767_225_600_000;
        const WINDOW_MS: i64 = 60_000;

        struct Setup {
            _dir: tempfile::TempDir,
            store: Arc<dyn Store>,
            clock: Arc<TestClock>,
            service: GatewayService,
            metrics: Arc<Metrics>,
            /// The device's `push_target_id`, registered at `T0`.
            target: String,
            registered: Registered,
        }

        async fn setup() -> Setup {
            let settings: GatewaySettings = serde_json::from_value(json!({
                "service_id": GATEWAY, "salt_epoch": "e1", "salt_secrets": {"e1": "/unread"},
                "aggressive_threshold": 2, "count_dwell_seconds": 120,
                "gateways": [{"url": URL, "service_id": GATEWAY}],
                "source_services": [{"id": STATION,
                    "keys": [{"key_id": "k1", "public_key": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}]}],
            }))
            .unwrap();
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 4).unwrap());
            let mut channels = Channels::default();
            channels.insert(Scripted::new(Vec::new()));
            let metrics = Arc::new(Metrics::new());
            let keys = CollapseKeys::new(salt_secrets(), settings.window);
            let clock = TestClock::at(T0);
            let settings_delivery = DeliverySettings::default();
            let delivery =
                Delivery::new(store.clone(), channels.clone(), settings_delivery, keys, metrics.clone(), clock.clone());
            let service =
                GatewayService::new(settings, salt_secrets(), store.clone(), channels, delivery, 8, metrics.clone());
            let body = json!({"device_id": DEVICE, "push_gateway_url": URL, "push_key": "fcm:the-token"});
            let request = RegisterDevice::parse(body.to_string().as_bytes()).unwrap();
            let (station, account) = (ServiceId::parse(STATION).unwrap(), AccountId::parse("ak:account:a").unwrap());
            let registered = service.register(&station, &account, &request).await.unwrap();
            let target = registered.push_target_id.to_string();
            Setup { _dir: dir, store, clock, service, metrics, target, registered }
        }

        impl Setup {
            fn at(&self, ms: i64) {
                self.clock.set(ms);
            }

            /// A notify for the device; `event` makes its source event.
            fn body(&self, event: Value) -> Value {
                let mut n = json!({"push_target_id": self.target, "wakeup_kind": "message", "devices": [{"device_id": DEVICE}]});
                n.as_object_mut().unwrap().extend(event.as_object().unwrap().clone());
                json!({"notification": n})
            }

            /// The device's outcome (`status` or `status/reason`).
            async fn notify(&self, key: &str, body: &Value) -> Result<String, NotifyError> {
                let answer = self.notify_raw(key, body).await?;
                let answer: Value = serde_json::from_slice(&answer).unwrap();
                let outcome = &answer["outcomes"][0];
                let status = outcome["gateway_status"].as_str().unwrap().to_owned();
                Ok(match outcome["reason_code"].as_str() {
                    Some(reason) => format!("{status}/{reason}"),
                    None => status,
                })
            }

            async fn notify_raw(&self, key: &str, body: &Value) -> Result<Vec<u8>, NotifyError> {
                let headers = NotifyHeaders {
                    idempotency_key: IdempotencyKey::parse(key).unwrap(),
                    source: ServiceId::parse(STATION).unwrap(),
                    destination: ServiceId::parse(GATEWAY).unwrap(),
                };
                self.service.notify(&headers, body.to_string().as_bytes()).await
            }

            /// Every stored wake-up, by due time: (not before, the payload
            /// the worker sends).
            async fn wakeups(&self) -> Vec<(i64, Value)> {
                let later = T0 + 3_600_000;
                let mut due = Vec::new();
                for l in self.store.gateway().wakeups_due(later, later + 1, 100).await.unwrap() {
                    let held = held_batch(self.store.as_ref(), &l.wakeup, later).await;
                    let payload = serde_json::from_slice(&held.unwrap_or(l.wakeup.payload)).unwrap();
                    due.push((l.wakeup.not_before_ms, payload));
                }
                due.sort_by_key(|(at, _)| *at);
                due
            }
        }

        #[tokio::test]
        async fn a_registration_expires_after_its_ttl() {
            let s = setup().await;
            assert_eq!(s.registered.expires_at_ms, T0 + 30 * 86_400_000);
            let body = s.body(json!({}));
            s.at(s.registered.expires_at_ms - 1);
            assert_eq!(s.notify("k1", &body).await.unwrap(), "accepted");
            s.at(s.registered.expires_at_ms);
            assert_eq!(s.notify("k2", &body).await.unwrap(), "rejected/push_target_unknown");
        }

        #[tokio::test]
        async fn one_wakeup_per_source_event_per_window() {
            let s = setup().await;
            let body = s.body(json!({}));
            s.at(T0 + 1_000);
            assert_eq!(s.notify("k1", &body).await.unwrap(), "accepted");
            // The same event under another Idempotency-Key, in the window.
            s.at(T0 + WINDOW_MS - 1);
            assert_eq!(s.notify("k2", &body).await.unwrap(), "duplicate");
            // Another event in the window; the same one in the next window.
            assert_eq!(s.notify("k3", &s.body(json!({"wakeup_kind": "mention"}))).await.unwrap(), "accepted");
            s.at(T0 + WINDOW_MS);
            assert_eq!(s.notify("k4", &body).await.unwrap(), "accepted");
            let due: Vec<_> = s.wakeups().await.into_iter().map(|(at, _)| at).collect();
            assert_eq!(due, [T0 + 1_000, T0 + WINDOW_MS - 1, T0 + WINDOW_MS]);
        }

        #[tokio::test]
        async fn beyond_the_threshold_wakeups_merge_into_one_batch_at_the_window_end() {
            let s = setup().await;
            for i in 1..=4 {
                s.at(T0 + i * 1_000);
                let body = s.body(json!({"counts": {"unread_increment": i}}));
                assert_eq!(s.notify(&format!("k{i}"), &body).await.unwrap(), "accepted", "notify {i}");
            }
            // The next window starts again at once.
            s.at(T0 + WINDOW_MS + 1_000);
            assert_eq!(s.notify("k5", &s.body(json!({"counts": {"unread_increment": 5}}))).await.unwrap(), "accepted");
            let due = s.wakeups().await;
            let at: Vec<_> = due.iter().map(|(at, _)| *at).collect();
            assert_eq!(at, [T0 + 1_000, T0 + 2_000, T0 + WINDOW_MS, T0 + WINDOW_MS + 1_000]);
            let increments: Vec<_> =
                due.iter().map(|(_, p)| p["counts"]["unread_increment"].as_u64().unwrap()).collect();
            assert_eq!(increments, [1, 2, 3 + 4, 5], "the third and fourth merged");
            let flagged: Vec<_> = due.iter().map(|(_, p)| p["evaluation_locus_unresolved"] == true).collect();
            assert_eq!(flagged, [false, false, true, false]);
        }

        #[tokio::test]
        async fn a_badge_bucket_keeps_for_the_dwell() {
            let s = setup().await;
            let badge = |kind: &str, bucket: &str| s.body(json!({"wakeup_kind": kind, "counts": {"badge": bucket}}));
            s.at(T0 + 1_000);
            assert_eq!(s.notify("k1", &badge("message", "2-5")).await.unwrap(), "accepted");
            s.at(T0 + 1_000 + 120_000 - 1);
            assert_eq!(s.notify("k2", &badge("message", "6-20")).await.unwrap(), "accepted");
            s.at(T0 + 1_000 + 120_000);
            assert_eq!(s.notify("k3", &badge("mention", "6-20")).await.unwrap(), "accepted");
            let shown: Vec<_> = s.wakeups().await.into_iter().map(|(_, p)| p["counts"]["badge"].clone()).collect();
            assert_eq!(shown, ["2-5", "2-5", "6-20"], "switched only once the dwell passed");
        }

        #[tokio::test]
        async fn an_idempotency_key_answers_replays_and_conflicts_while_it_is_kept() {
            let s = setup().await;
            let (a, b) = (s.body(json!({})), s.body(json!({"wakeup_kind": "mention"})));
            s.at(T0 + 1_000);
            let answer = s.notify_raw("k1", &a).await.unwrap();
            s.at(T0 + 2_000);
            assert_eq!(s.notify_raw("k1", &a).await.unwrap(), answer, "the stored answer");
            assert_eq!(s.notify_raw("k1", &b).await, Err(NotifyError::DuplicateConflict));
            assert_eq!(s.wakeups().await.len(), 1, "a replay stores nothing");
            let accepted = s.metrics.gateway.device_outcomes.with_label_values(&["accepted"]).get();
            assert_eq!(accepted, 1, "a replay is not counted again");
            // After idempotency_retention (24 h) the key is free again.
            s.at(T0 + 1_000 + 86_400_000);
            assert_eq!(s.notify("k1", &b).await.unwrap(), "accepted");
        }

        #[tokio::test]
        async fn a_claim_in_progress_is_taken_over_once_its_lease_ran_out() {
            let s = setup().await;
            let body = s.body(json!({}));
            let limits = s.service.settings.notify_limits();
            let digest = NotifyRequest::parse(body.to_string().as_bytes(), &limits).unwrap().digest;
            let key = NotifyKey {
                tenant: ServiceId::parse(STATION).unwrap(),
                idempotency_key: IdempotencyKey::parse("k1").unwrap(),
            };
            let lease_until = T0 + CLAIM_LEASE.as_millis() as i64;
            let claim = s.store.gateway().notify_claim(&key, &digest.0, T0, lease_until, T0 + 86_400_000).await;
            assert_eq!(claim.unwrap(), NotifyClaim::Claimed, "another request holds it");
            s.at(lease_until - 1);
            assert_eq!(s.notify("k1", &body).await, Err(NotifyError::InProgress));
            s.at(lease_until);
            assert_eq!(s.notify("k1", &body).await.unwrap(), "accepted");
        }
    }
}
