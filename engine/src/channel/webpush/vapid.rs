//! RFC 8292 VAPID: the application server identifies itself to a push
//! service with an ES256 JWT for the endpoint's origin, sent as
//! `Authorization: vapid t=<jwt>, k=<public key>`. Tokens are cached per
//! origin and signed again an hour before they expire.

use std::collections::HashMap;
use std::sync::Mutex;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderValue;

/// A token's `exp` is this far ahead of its signing (RFC 8292 section 2:
/// no more than 24 hours after the request).
pub const TOKEN_LIFETIME_SECS: u64 = 12 * 3600;
/// A cached token is used until it has less than this left.
pub const REFRESH_MARGIN_SECS: u64 = 3600;
const _: () = assert!(TOKEN_LIFETIME_SECS > REFRESH_MARGIN_SECS && TOKEN_LIFETIME_SECS <= 24 * 3600);
/// Endpoints come from recipients, so their origins are bounded here: when
/// full, the expiring tokens go, and if none do, all of them.
const MAX_CACHED_ORIGINS: usize = 1024;

/// Why the VAPID key is refused at start. Names no key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VapidKeyError {
    #[error("holds no PEM private key")]
    NoKey,
    #[error("is not a P-256 private key (PKCS#8 or SEC 1 PEM)")]
    NotP256,
}

struct Cached {
    authorization: HeaderValue,
    exp: u64,
}

/// The application server's VAPID key, its subject and the tokens signed
/// with it.
pub struct Vapid {
    key: EcdsaKeyPair,
    /// `k`: the uncompressed public key, unpadded base64url.
    public_key: String,
    /// `sub`: a `mailto:` or `https:` URI to reach the operator.
    subject: String,
    cache: Mutex<HashMap<String, Cached>>,
}

impl Vapid {
    /// Reads a PEM private key (`PRIVATE KEY` or `EC PRIVATE KEY`) on P-256.
    pub fn from_pem(pem: &[u8], subject: String) -> Result<Self, VapidKeyError> {
        let der = rustls_pemfile::private_key(&mut &pem[..]).ok().flatten().ok_or(VapidKeyError::NoKey)?;
        let key = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_FIXED_SIGNING, der.secret_der())
            .map_err(|_| VapidKeyError::NotP256)?;
        let public_key = URL_SAFE_NO_PAD.encode(key.public_key().as_ref());
        Ok(Self { key, public_key, subject, cache: Mutex::new(HashMap::new()) })
    }

    /// The public key as browsers are given it (`applicationServerKey`).
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// The Authorization value for a request to `origin` at `now_unix_s`,
    /// signed now or cached. Err only when the library cannot sign.
    pub fn authorization(&self, origin: &str, now_unix_s: u64) -> Result<HeaderValue, aws_lc_rs::error::Unspecified> {
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(cached) = cache.get(origin)
            && cached.exp > now_unix_s.saturating_add(REFRESH_MARGIN_SECS)
        {
            return Ok(cached.authorization.clone());
        }
        let exp = now_unix_s.saturating_add(TOKEN_LIFETIME_SECS);
        let authorization = self.sign(origin, exp)?;
        if cache.len() >= MAX_CACHED_ORIGINS && !cache.contains_key(origin) {
            cache.retain(|_, c| c.exp > now_unix_s.saturating_add(REFRESH_MARGIN_SECS));
            if cache.len() >= MAX_CACHED_ORIGINS {
                cache.clear();
            }
        }
        cache.insert(origin.to_owned(), Cached { authorization: authorization.clone(), exp });
        Ok(authorization)
    }

    /// Drops the cached token of `origin` (the push service refused it).
    pub fn forget(&self, origin: &str) {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(origin);
    }

    fn sign(&self, aud: &str, exp: u64) -> Result<HeaderValue, aws_lc_rs::error::Unspecified> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({"aud": aud, "exp": exp, "sub": self.subject});
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signed = format!("{header}.{claims}");
        // Fixed-size r || s, as JWS ES256 wants (RFC 7518 section 3.4).
        let signature = self.key.sign(&SystemRandom::new(), signed.as_bytes())?;
        let value = format!("vapid t={signed}.{}, k={}", URL_SAFE_NO_PAD.encode(signature.as_ref()), self.public_key);
        let mut value = HeaderValue::try_from(value).map_err(|_| aws_lc_rs::error::Unspecified)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// The origin of an https endpoint (RFC 6454): scheme, lowercased host,
/// and the port only when it is not 443.
pub fn origin(host: &str, port: u16) -> String {
    let host = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
    if port == 443 { format!("https://{host}") } else { format!("https://{host}:{port}") }
}

#[cfg(test)]
mod tests {
    use fanout_testkit::webpush::{VapidTestKey, check_vapid};

    use super::*;

    fn vapid() -> Vapid {
        Vapid::from_pem(VapidTestKey::generate().pem.as_bytes(), "mailto:ops@example.com".into()).unwrap()
    }

    #[test]
    fn the_token_verifies_with_k_and_names_the_origin() {
        let v = vapid();
        let now = 1_700_000_000;
        let auth = v.authorization("https://push.example.net", now).unwrap();
        assert!(auth.is_sensitive());
        let checked = check_vapid(auth.to_str().unwrap()).unwrap();
        assert_eq!(checked.aud, "https://push.example.net");
        assert_eq!(checked.exp, now + TOKEN_LIFETIME_SECS);
        assert!(checked.exp <= now + 24 * 3600, "RFC 8292: at most 24 hours");
        assert_eq!(checked.sub.as_deref(), Some("mailto:ops@example.com"));
        assert_eq!(checked.key, v.public_key());
        assert_eq!(URL_SAFE_NO_PAD.decode(v.public_key()).unwrap().len(), 65);
    }

    #[test]
    fn tokens_are_cached_per_origin_until_an_hour_before_expiry() {
        let v = vapid();
        let now = 1_700_000_000;
        let a = v.authorization("https://a.example", now).unwrap();
        let b = v.authorization("https://b.example", now).unwrap();
        assert_ne!(a, b);
        assert_eq!(v.authorization("https://a.example", now + 60).unwrap(), a, "cached");
        let late = now + TOKEN_LIFETIME_SECS - REFRESH_MARGIN_SECS - 1;
        assert_eq!(v.authorization("https://a.example", late).unwrap(), a, "still more than an hour left");
        let renewed = v.authorization("https://a.example", late + 1).unwrap();
        assert_ne!(renewed, a);
        assert_eq!(check_vapid(renewed.to_str().unwrap()).unwrap().exp, late + 1 + TOKEN_LIFETIME_SECS);
        v.forget("https://b.example");
        assert_ne!(v.authorization("https://b.example", now + 60).unwrap(), b, "forgotten: signed again");
    }

    #[test]
    fn the_cache_is_bounded() {
        let v = vapid();
        for i in 0..MAX_CACHED_ORIGINS + 10 {
            v.authorization(&format!("https://h{i}.example"), 1_700_000_000).unwrap();
        }
        assert!(v.cache.lock().unwrap().len() <= MAX_CACHED_ORIGINS);
    }

    #[test]
    fn keys_must_be_p256_pem() {
        assert_eq!(Vapid::from_pem(b"nothing", String::new()).err(), Some(VapidKeyError::NoKey));
        let rsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap().serialize_pem();
        assert_eq!(Vapid::from_pem(rsa.as_bytes(), String::new()).err(), Some(VapidKeyError::NotP256));
        // SEC 1 ("EC PRIVATE KEY"), as `openssl ecparam -genkey` writes it.
        use aws_lc_rs::encoding::AsDer as _;
        let sec1 = vapid().key.private_key().as_der().unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(sec1.as_ref());
        let pem = format!("-----BEGIN EC PRIVATE KEY-----\n{b64}\n-----END EC PRIVATE KEY-----\n");
        assert!(Vapid::from_pem(pem.as_bytes(), String::new()).is_ok());
    }

    #[test]
    fn origins() {
        assert_eq!(origin("push.example.net", 443), "https://push.example.net");
        assert_eq!(origin("127.0.0.1", 8443), "https://127.0.0.1:8443");
        assert_eq!(origin("::1", 443), "https://[::1]");
    }
}
