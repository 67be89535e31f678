//! The gateway's window state in the store (`GatewayStore::state`): a
//! read-modify-write by compare-and-set, each device's pending-wakeup ledger,
//! and the payload a batch wakeup holds. The notify service and the delivery
//! worker both change it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::egress::WakeupPayload;
use super::pending::PendingWakeups;
use crate::domain::{GatewayWakeup, ServiceId};
use crate::store::{Store, StoreError};

/// Compare-and-set attempts of one state change.
const STATE_ATTEMPTS: usize = 16;

/// Read-modify-write of a window state value by compare-and-set, tried
/// again when another writer changed it in between; kept until the
/// `expires_at_ms` of the new value.
pub(super) async fn update_state<T, R>(
    store: &dyn Store,
    tenant: &ServiceId,
    key: &[u8],
    expires_at_ms: impl Fn(&T) -> i64,
    now: i64,
    mut change: impl FnMut(&mut T) -> R,
) -> Result<R, StoreError>
where
    T: Serialize + DeserializeOwned + Default,
{
    for _ in 0..STATE_ATTEMPTS {
        let old = store.gateway().state(tenant, key, now).await?;
        let mut value: T = old.as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
        let result = change(&mut value);
        let new = serde_json::to_vec(&value).expect("state serializes");
        if store.gateway().state_cas(tenant, key, old.as_deref(), &new, now, expires_at_ms(&value)).await? {
            return Ok(result);
        }
    }
    Err(StoreError::Backend("gateway state: too many concurrent changes".into()))
}

/// A change of a device's pending-wakeup ledger (`pending`), shared by the
/// notify service and the delivery worker; kept until its last entry
/// expires.
pub async fn update_ledger<R>(
    store: &dyn Store,
    tenant: &ServiceId,
    key: &[u8],
    now: i64,
    change: impl FnMut(&mut PendingWakeups) -> R,
) -> Result<R, StoreError> {
    update_state(store, tenant, key, |l: &PendingWakeups| l.keep_until(now), now, change).await
}

/// The payload of a batch wakeup as merged so far (`batch_id`): the worker
/// sends it rather than the one stored with the bucket's first wakeup.
/// `None` for any other wakeup.
pub async fn held_batch(store: &dyn Store, wakeup: &GatewayWakeup, now: i64) -> Option<Vec<u8>> {
    if !is_batch_id(&wakeup.id) {
        return None;
    }
    let held = store.gateway().state(&wakeup.route.tenant, wakeup.id.as_bytes(), now).await.ok()??;
    let payload: Option<WakeupPayload> = serde_json::from_slice(&held).ok()?;
    payload.map(|p| serde_json::to_vec(&p).expect("a payload serializes"))
}

/// 32 hex characters of the SHA-256 of length-prefixed parts.
pub(super) fn hex32(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part);
    }
    hex::encode(&h.finalize()[..16])
}

/// A batch wakeup's id: `B` (never in lowercase hex, so never a plain
/// wakeup's) and 31 hex characters, one per route and flush time, so the
/// wakeups held for it are one.
pub(super) fn batch_id(tenant: &ServiceId, route_key: &[u8], flush_at_ms: u64) -> String {
    let h = hex32(&[tenant.as_str().as_bytes(), route_key, &flush_at_ms.to_be_bytes()]);
    format!("B{}", &h[..31])
}

pub(super) fn is_batch_id(id: &str) -> bool {
    id.len() == 32 && id.starts_with('B')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_are_told_apart() {
        let (station, other) = (ServiceId::parse("station").unwrap(), ServiceId::parse("other").unwrap());
        let b = batch_id(&station, b"route", 60_000);
        assert_eq!(b.len(), 32);
        assert!(is_batch_id(&b));
        assert!((0..64u8).all(|i| !is_batch_id(&hex32(&[&[i]]))));
        assert_ne!(b, batch_id(&station, b"route", 120_000));
        assert_ne!(b, batch_id(&other, b"route", 60_000));
    }
}
