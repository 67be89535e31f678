//! `GET /admin/recipients/{recipient_id}/deliveries` on the ops listener:
//! the recent delivery attempts of one recipient on this node, from the
//! engine's delivery history (`engine.history`), newest first. Operator role
//! (like `/metrics`). The answer holds positions, symbols, statuses and
//! times: never a token, URL, topic or payload.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use fanout_engine::delivery::History;
use fanout_engine::delivery::history::AttemptRecord;
use fanout_engine::domain::RecipientId;
use serde_json::{Value, json};

use crate::problem::Problem;

/// The answer for `recipient` (the path's text) from `history` (`None`:
/// off) of `node`.
pub async fn deliveries(history: Option<&History>, node: &str, recipient: &str) -> Response {
    let Some(history) = history else {
        let off = "the delivery history is off (engine.history.max_records = 0)";
        return Problem::new(StatusCode::NOT_FOUND, "history_off", off).into_response();
    };
    let Some(id) = parse_recipient(recipient) else {
        return Problem::invalid("recipient_id", "must be 64 hexadecimal digits").into_response();
    };
    match history.of(id).await {
        Ok(recent) => {
            let attempts: Vec<Value> = recent.attempts.iter().map(attempt).collect();
            let body = json!({
                "recipient_id": recipient.to_ascii_lowercase(),
                "node": node,
                "dropped_records": recent.dropped,
                "attempts": attempts,
            });
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(e) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, "history_unavailable", e.to_string()).into_response(),
    }
}

fn parse_recipient(text: &str) -> Option<RecipientId> {
    let bytes: [u8; 32] = hex::decode(text).ok()?.try_into().ok()?;
    Some(RecipientId::from_bytes(bytes))
}

fn attempt(r: &AttemptRecord) -> Value {
    json!({
        "shard": r.shard,
        "sequence_id": r.sequence_id.to_string(),
        "channel": r.channel.as_str(),
        "attempt": r.attempt,
        "outcome": r.outcome,
        "ended": r.ended,
        "retry_in_ms": r.retry_in.map(|d| d.as_millis() as u64),
        "provider_status": r.provider_status,
        "provider_reason": r.provider_reason.as_ref().map(|reason| reason.as_str()),
        "published_at_ms": r.published_at_ms,
        "first_attempt_at_ms": r.first_attempt_at_ms,
        "sent_at_ms": r.sent_at_ms,
        "answered_at_ms": r.answered_at_ms,
    })
}
