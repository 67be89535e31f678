//! OAuth2 access tokens for the FCM HTTP v1 API: a service account's
//! JWT-bearer grant (RS256) at its `token_uri`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::Full;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::domain::Channel;
use crate::metrics::{Metrics, TokenMetrics};
use crate::transport::pool::{HttpsClient, bounded, encode_path_segment, request, unix_now_secs};

/// An access token is replaced this long before it expires.
const TOKEN_EXPIRY_MARGIN: Duration = Duration::from_secs(300);
/// The longest `expires_in` believed. Google's tokens live an hour; a token
/// endpoint that answers more (up to u64::MAX seconds) costs a
/// refresh a day instead of an `Instant` overflow.
const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(86_400);
/// The OAuth2 scope of the FCM HTTP v1 API.
pub const FCM_SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Lifetime of the signed assertion (Google accepts at most an hour).
const ASSERTION_LIFETIME_SECS: u64 = 3600;

/// The parts of a Google service-account JSON key file FCM needs. Other
/// fields are ignored. Not `Debug`: it holds the private key.
#[derive(Deserialize)]
pub(super) struct ServiceAccount {
    pub(super) project_id: String,
    pub(super) client_email: String,
    pub(super) private_key: String,
    #[serde(default)]
    pub(super) private_key_id: Option<String>,
    pub(super) token_uri: String,
}

#[derive(Serialize)]
struct AssertionClaims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: u64,
}

/// A cached access token.
pub(super) struct AccessToken {
    /// `Bearer <token>`, marked sensitive.
    pub(super) authorization: HeaderValue,
    refresh_at: Instant,
}

/// Why no access token could be had; kept free of any credential text.
#[derive(Debug, thiserror::Error)]
pub(super) enum TokenError {
    #[error("cannot sign the service-account assertion: {0}")]
    Sign(jsonwebtoken::errors::Error),
    #[error("token endpoint unreachable")]
    Connect,
    #[error("token endpoint answered {0}")]
    Status(StatusCode),
    #[error("token endpoint answered an unreadable body")]
    Body,
}

/// OAuth2 access tokens for the service account, cached until
/// `TOKEN_EXPIRY_MARGIN` before they expire and fetched by one caller at a
/// time (single flight).
pub(super) struct AccessTokens {
    client: HttpsClient,
    token_uri: Uri,
    token_uri_text: String,
    client_email: String,
    key: EncodingKey,
    key_id: Option<String>,
    current: RwLock<Option<Arc<AccessToken>>>,
    refresh: tokio::sync::Mutex<()>,
    metrics: TokenMetrics,
}

impl AccessTokens {
    pub(super) fn new(
        client: HttpsClient,
        token_uri: Uri,
        account: ServiceAccount,
        key: EncodingKey,
        metrics: &Metrics,
    ) -> Self {
        Self {
            client,
            token_uri,
            token_uri_text: account.token_uri,
            client_email: account.client_email,
            key,
            key_id: account.private_key_id.filter(|k| !k.is_empty()),
            current: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
            metrics: TokenMetrics::new(metrics, Channel::Fcm),
        }
    }

    pub(super) fn assertion(&self) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = self.key_id.clone();
        let iat = unix_now_secs();
        let claims = AssertionClaims {
            iss: &self.client_email,
            scope: FCM_SCOPE,
            aud: &self.token_uri_text,
            iat,
            exp: iat + ASSERTION_LIFETIME_SECS,
        };
        jsonwebtoken::encode(&header, &claims, &self.key)
    }

    fn cached(&self) -> Option<Arc<AccessToken>> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|t| Instant::now() < t.refresh_at).cloned()
    }

    /// A valid access token, fetched when none is cached.
    pub(super) async fn get(&self) -> Result<Arc<AccessToken>, TokenError> {
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        let _single_flight = self.refresh.lock().await;
        // Whoever held the lock before may have fetched one.
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        match self.fetch().await {
            Ok(token) => {
                self.metrics.refreshes.inc();
                let token = Arc::new(token);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
                Ok(token)
            }
            Err(e) => {
                self.metrics.failures.inc();
                tracing::warn!(error = %e, "cannot obtain an FCM access token");
                Err(e)
            }
        }
    }

    /// Drops `used` if it is still the cached token (FCM refused it).
    pub(super) fn invalidate(&self, used: &Arc<AccessToken>) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|t| Arc::ptr_eq(t, used)) {
            *current = None;
        }
    }

    async fn fetch(&self) -> Result<AccessToken, TokenError> {
        let assertion = self.assertion().map_err(TokenError::Sign)?;
        let form = format!("grant_type={}&assertion={}", form_encode(JWT_BEARER_GRANT), form_encode(&assertion));
        let req = Request::post(self.token_uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form)))
            .map_err(|_| TokenError::Connect)?;
        let answer = bounded(request(&self.client, req)).await.map_err(|_| TokenError::Connect)?;
        if answer.status != StatusCode::OK {
            return Err(TokenError::Status(answer.status));
        }
        access_token(&answer.body, Instant::now())
    }
}

/// The token of a 200 answer's body, received at `now`.
fn access_token(body: &[u8], now: Instant) -> Result<AccessToken, TokenError> {
    let parsed: TokenResponse = serde_json::from_slice(body).map_err(|_| TokenError::Body)?;
    let mut authorization =
        HeaderValue::try_from(format!("Bearer {}", parsed.access_token)).map_err(|_| TokenError::Body)?;
    authorization.set_sensitive(true);
    Ok(AccessToken { authorization, refresh_at: refresh_at(now, parsed.expires_in) })
}

/// When a token that expires `expires_in` seconds after `now` is replaced:
/// 5 minutes early, a short-lived one at half its life; never later than
/// `MAX_TOKEN_LIFETIME` from now.
fn refresh_at(now: Instant, expires_in: u64) -> Instant {
    let lifetime = Duration::from_secs(expires_in).min(MAX_TOKEN_LIFETIME);
    let margin = TOKEN_EXPIRY_MARGIN.min(lifetime / 2);
    // Cannot overflow with the cap on any real clock; if it did, the token
    // would be fetched again at its next use.
    now.checked_add(lifetime - margin).unwrap_or(now)
}

/// application/x-www-form-urlencoded for one value: unreserved characters
/// pass, everything else is `%XX` (the same set as a path segment).
fn form_encode(value: &str) -> String {
    encode_path_segment(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expires_in_near_u64_max_is_capped_not_an_overflow() {
        let now = Instant::now();
        for expires_in in [u64::MAX, u64::MAX - 1, u64::MAX / 2, 1 << 63, 86_401] {
            let body = format!(r#"{{"access_token":"ya29.x","expires_in":{expires_in},"token_type":"Bearer"}}"#);
            let token = access_token(body.as_bytes(), now).unwrap();
            assert_eq!(token.refresh_at, now + MAX_TOKEN_LIFETIME - TOKEN_EXPIRY_MARGIN, "{expires_in}");
        }
        assert_eq!(refresh_at(now, 3600), now + Duration::from_secs(3300));
        assert_eq!(refresh_at(now, 60), now + Duration::from_secs(30));
        assert_eq!(refresh_at(now, 0), now);
        // Past u64, negative or fractional: not a token.
        for expires_in in ["18446744073709551616", "1e30", "-1", "3600.5", "\"3600\""] {
            let body = format!(r#"{{"access_token":"ya29.x","expires_in":{expires_in}}}"#);
            assert!(matches!(access_token(body.as_bytes(), now), Err(TokenError::Body)), "{expires_in}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any body: a token or `Body`, never a panic; a token is
            /// replaced after `now` by at most its capped lifetime.
            #[test]
            fn any_token_answer_gives_a_bounded_refresh_time(
                body in "\\PC{0,60}|\\{\"access_token\":\"[ -~]{0,20}\",\"expires_in\":-?[0-9]{1,25}(\\.[0-9])?\\}",
                expires_in: u64,
            ) {
                let now = Instant::now();
                if let Ok(token) = access_token(body.as_bytes(), now) {
                    prop_assert!(token.refresh_at <= now + MAX_TOKEN_LIFETIME);
                    prop_assert!(token.authorization.is_sensitive());
                }
                let at = refresh_at(now, expires_in);
                prop_assert!(at >= now && at <= now + MAX_TOKEN_LIFETIME);
                if expires_in > 0 && expires_in <= MAX_TOKEN_LIFETIME.as_secs() {
                    prop_assert!(at > now && at < now + Duration::from_secs(expires_in));
                }
            }
        }
    }

    #[test]
    fn form_values_are_encoded() {
        assert_eq!(form_encode(JWT_BEARER_GRANT), "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer");
        assert_eq!(form_encode("a.b-c_d"), "a.b-c_d");
    }
}
