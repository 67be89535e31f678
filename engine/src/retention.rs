//! PUSH-226: delete every recipient that has not renewed within recipient_ttl_seconds.

use std::sync::Arc;

use crate::clock::unix_now_ns;
use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Clone)]
pub struct RetentionArgs {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub ttl_seconds: u64,
    pub interval_seconds: u64,
}

/// One pass. A failure is logged and retried at the next pass.
pub async fn run_pass(args: &RetentionArgs) {
    let cutoff = unix_now_ns().saturating_sub((args.ttl_seconds as i64).saturating_mul(1_000_000_000));
    // A failure is counted and logged by the instrumented store; the next pass retries.
    if let Ok(n) = args.store.delete_expired(cutoff).await {
        args.metrics.recipients_deleted.with_label_values(&["expired"]).inc_by(n);
        if n > 0 {
            tracing::info!(deleted = n, "retention pass deleted expired recipients");
        }
    }
}
