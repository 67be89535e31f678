//! The APNs provider token: an ES256 JWT for the configured key, cached and
//! refreshed on APNs's schedule.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::domain::Channel;
use crate::metrics::{Metrics, TokenMetrics};
use crate::transport::pool::unix_now_secs;

/// APNs accepts a provider token for an hour; refresh well before.
const TOKEN_REFRESH_AFTER: Duration = Duration::from_secs(50 * 60);
/// APNs answers TooManyProviderTokenUpdates to tokens replaced more often
/// than this; only the forced refresh after ExpiredProviderToken may.
const MIN_TOKEN_REFRESH_INTERVAL: Duration = Duration::from_secs(20 * 60);
const _: () = assert!(TOKEN_REFRESH_AFTER.as_secs() >= MIN_TOKEN_REFRESH_INTERVAL.as_secs());

#[derive(Serialize)]
struct ProviderClaims<'a> {
    iss: &'a str,
    iat: u64,
}

/// One signed provider token.
pub(super) struct ProviderToken {
    /// `bearer <jwt>`, marked sensitive so it is never printed.
    pub(super) authorization: HeaderValue,
    issued: Instant,
    generation: u64,
}

/// The cached provider token: signed on first use, replaced after
/// `TOKEN_REFRESH_AFTER`, or at once when APNs answered ExpiredProviderToken
/// to the current one.
pub(super) struct ProviderTokens {
    key: EncodingKey,
    key_id: String,
    team_id: String,
    pub(super) current: Mutex<Option<Arc<ProviderToken>>>,
    metrics: TokenMetrics,
}

impl ProviderTokens {
    pub(super) fn new(key: EncodingKey, key_id: String, team_id: String, metrics: &Metrics) -> Self {
        let metrics = TokenMetrics::new(metrics, Channel::Apns);
        Self { key, key_id, team_id, current: Mutex::new(None), metrics }
    }

    pub(super) fn sign(&self, generation: u64) -> Result<ProviderToken, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(self.key_id.clone());
        let claims = ProviderClaims { iss: &self.team_id, iat: unix_now_secs() };
        let jwt = jsonwebtoken::encode(&header, &claims, &self.key)?;
        let mut authorization = HeaderValue::try_from(format!("bearer {jwt}"))
            .map_err(|_| jsonwebtoken::errors::ErrorKind::InvalidToken)?;
        // Sensitive: never printed, and sent as an HPACK never-indexed
        // literal on every request. Letting HPACK index it instead, as Pushy
        // (Netty) and apns2 (Go) do, was weighed. RFC 7541 §7.1.3
        // would allow it: the value is a high-entropy signature, replaced
        // within the hour, on connections only fanout writes to, so no
        // guessing attack applies. It stays a literal because h2 (hyper's
        // HTTP/2) never indexes an `authorization` value whatever this flag
        // says (nghttp2's rule, `Header::skip_value_index`), and Apple's
        // HPACK guidance asks for `authorization` as a literal without
        // indexing (APNs keeps a small table). Its measured cost per request
        // is in docs/BENCHMARKS-HISTORY.md ("APNs request size").
        authorization.set_sensitive(true);
        Ok(ProviderToken { authorization, issued: Instant::now(), generation })
    }

    /// Replaces the current token; counts the refresh or the failure.
    fn replace(&self, current: &mut Option<Arc<ProviderToken>>) -> Option<Arc<ProviderToken>> {
        let generation = current.as_ref().map_or(0, |t| t.generation + 1);
        match self.sign(generation) {
            Ok(token) => {
                self.metrics.refreshes.inc();
                let token = Arc::new(token);
                *current = Some(token.clone());
                Some(token)
            }
            Err(e) => {
                self.metrics.failures.inc();
                tracing::warn!(error = %e, "cannot sign an APNs provider token");
                None
            }
        }
    }

    /// The token to send with, refreshed when it is due.
    pub(super) fn get(&self) -> Option<Arc<ProviderToken>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(token) if token.issued.elapsed() < TOKEN_REFRESH_AFTER => Some(token.clone()),
            _ => self.replace(&mut current),
        }
    }

    /// After ExpiredProviderToken for `used`: a new token, unless another
    /// attempt already replaced `used` (one refresh for many such answers).
    pub(super) fn refresh_after_expired(&self, used: &ProviderToken) -> Option<Arc<ProviderToken>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(token) if token.generation != used.generation => Some(token.clone()),
            _ => self.replace(&mut current),
        }
    }
}
