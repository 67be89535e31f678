//! Service-to-service authentication of notify (§5.1: the service headers are
//! "httpMessageSignature 伴随项"; §3.4: the signature covers exact
//! Source-Service-ID, Destination-Service-ID and Content-Digest):
//! RFC 9421 HTTP Message Signatures with Ed25519 keys per source service,
//! and RFC 9530 `Content-Digest`.
//!
//! Verification is strict: the covered components must include everything
//! the operation requires, components with parameters (`;sf`, `;key`, `;bs`,
//! `;req`, `@query-param`) are refused rather than half-understood,
//! `created` and `keyid` are required, `alg` (when present) must be
//! `ed25519`, and the time window is checked before the signature. The
//! `@signature-params` line is the re-serialization of the parsed inner list
//! (RFC 9421 §2.3), so whitespace in the header cannot change what is signed.
//!
//! `sign` is the same construction run the other way, for Stations, tests
//! and the load harness.

use std::fmt::Write as _;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::Deserialize;
use sfv::{BareItem, Dictionary, FieldType as _, InnerList, Item, List, ListEntry, Parser};
use sha2::{Digest as _, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::domain::ServiceId;

pub const HEADER_SIGNATURE_INPUT: &str = "signature-input";
pub const HEADER_SIGNATURE: &str = "signature";
pub const HEADER_CONTENT_DIGEST: &str = "content-digest";

/// Components that name the request's target; a signature must cover one.
const TARGET_COMPONENTS: [&str; 3] = ["@target-uri", "@path", "@request-target"];

/// Why a signature is refused. Every variant answers 401; the labels are
/// bounded, for the rejection counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case", prefix = "signature_")]
pub enum SignatureError {
    #[error("Signature-Input or Signature is missing")]
    Missing,
    #[error("Signature-Input or Signature is malformed")]
    Malformed,
    #[error("a covered component is not supported")]
    UnsupportedComponent,
    #[error("a covered header is absent from the request")]
    ComponentAbsent,
    #[error("the signature does not cover every required component")]
    #[strum(serialize = "not_covering")]
    NotCovered,
    #[error("the signature names no key of the source service")]
    UnknownKey,
    #[error("the signature algorithm is not ed25519")]
    UnsupportedAlgorithm,
    #[error("the signature was created too long ago or has expired")]
    Stale,
    #[error("the signature was created in the future")]
    FromFuture,
    #[error("the signature does not verify")]
    Mismatch,
}

impl SignatureError {
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// The parts of a request a signature can cover. `authority` is the
/// request's `:authority` (HTTP/2) or `Host` (HTTP/1.1); `scheme` is the
/// listener's.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub authority: &'a str,
    /// The request target in origin form (`/path?query`).
    pub path_and_query: &'a str,
    pub headers: &'a http::HeaderMap,
}

impl SignedRequest<'_> {
    /// RFC 9421 §2.1 / §2.2: the value of one component.
    fn component(&self, name: &str) -> Result<String, SignatureError> {
        let (path, query) = match self.path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (self.path_and_query, None),
        };
        Ok(match name {
            "@method" => self.method.to_owned(),
            "@target-uri" => format!("{}://{}{}", self.scheme, self.authority, self.path_and_query),
            "@authority" => self.authority.to_ascii_lowercase(),
            "@scheme" => self.scheme.to_ascii_lowercase(),
            "@request-target" => self.path_and_query.to_owned(),
            "@path" if path.is_empty() => "/".to_owned(),
            "@path" => path.to_owned(),
            "@query" => format!("?{}", query.unwrap_or("")),
            _ if name.starts_with('@') => return Err(SignatureError::UnsupportedComponent),
            _ => {
                // §2.1: field lines trimmed and joined with ", ".
                let mut lines = self.headers.get_all(name).iter().peekable();
                if lines.peek().is_none() {
                    return Err(SignatureError::ComponentAbsent);
                }
                let mut value = String::new();
                for (i, line) in lines.enumerate() {
                    let text = line.to_str().map_err(|_| SignatureError::Malformed)?;
                    if i > 0 {
                        value.push_str(", ");
                    }
                    value.push_str(text.trim_matches([' ', '\t']));
                }
                value
            }
        })
    }
}

/// A component identifier we can verify: a lowercase field name or a
/// derived component, without parameters.
fn valid_component_name(name: &str) -> bool {
    let body = name.strip_prefix('@').unwrap_or(name);
    !body.is_empty()
        && body.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(&b))
}

/// The signature parameters of RFC 9421 §2.3 that fanout reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureParams {
    pub created: i64,
    pub expires: Option<i64>,
    pub key_id: String,
    /// Whether `alg="ed25519"` is stated.
    pub alg: bool,
    pub nonce: Option<String>,
    pub tag: Option<String>,
}

/// What an operation demands of a signature.
#[derive(Debug, Clone, Copy)]
pub struct SignaturePolicy {
    /// Components that must be covered.
    pub required: &'static [&'static str],
    /// `created` older than this is refused.
    pub max_age: Duration,
    /// Clock tolerance for `created` ahead of now and `expires` behind it.
    pub skew: Duration,
}

impl SignaturePolicy {
    /// Notify: the method, the target (one of `@target-uri`, `@path`,
    /// `@request-target`, always required as well), the four service headers
    /// and the body's digest.
    pub const NOTIFY: &'static [&'static str] = &[
        "@method",
        "arkret-operation",
        "idempotency-key",
        "source-service-id",
        "destination-service-id",
        "content-digest",
    ];

    pub fn notify(max_age: Duration, skew: Duration) -> Self {
        Self { required: Self::NOTIFY, max_age, skew }
    }
}

/// A signature that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub label: String,
    pub key_id: String,
    pub created: i64,
}

/// One parsed Signature-Input member.
struct Candidate {
    label: String,
    covered: Vec<String>,
    params: SignatureParams,
    inner: InnerList,
}

fn parse_dictionary(headers: &http::HeaderMap, name: &str) -> Result<Dictionary, SignatureError> {
    let mut joined = String::new();
    for (i, line) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            joined.push_str(", ");
        }
        joined.push_str(line.to_str().map_err(|_| SignatureError::Malformed)?);
    }
    if joined.is_empty() {
        return Err(SignatureError::Missing);
    }
    Parser::new(&joined).parse::<Dictionary>().map_err(|_| SignatureError::Malformed)
}

fn candidate(label: &str, entry: &ListEntry) -> Result<Candidate, SignatureError> {
    let ListEntry::InnerList(inner) = entry else { return Err(SignatureError::Malformed) };
    let mut covered: Vec<String> = Vec::with_capacity(inner.items.len());
    for item in &inner.items {
        let name = item.bare_item.as_string().ok_or(SignatureError::Malformed)?.as_str();
        if !item.params.is_empty() || !valid_component_name(name) {
            return Err(SignatureError::UnsupportedComponent);
        }
        if covered.iter().any(|c| c == name) {
            return Err(SignatureError::Malformed);
        }
        covered.push(name.to_owned());
    }
    let (mut created, mut expires, mut key_id, mut alg, mut nonce, mut tag) = (None, None, None, false, None, None);
    let text = |v: &BareItem| v.as_string().map(|s| s.as_str().to_owned()).ok_or(SignatureError::Malformed);
    let integer = |v: &BareItem| v.as_integer().map(i64::from).ok_or(SignatureError::Malformed);
    for (key, value) in &inner.params {
        match key.as_str() {
            "created" => created = Some(integer(value)?),
            "expires" => expires = Some(integer(value)?),
            "keyid" => key_id = Some(text(value)?),
            "alg" if text(value)? == "ed25519" => alg = true,
            "alg" => return Err(SignatureError::UnsupportedAlgorithm),
            "nonce" => nonce = Some(text(value)?),
            "tag" => tag = Some(text(value)?),
            // Unknown parameters are covered by @signature-params anyway.
            _ => {}
        }
    }
    let params = SignatureParams {
        created: created.ok_or(SignatureError::Malformed)?,
        expires,
        key_id: key_id.ok_or(SignatureError::Malformed)?,
        alg,
        nonce,
        tag,
    };
    if params.expires.is_some_and(|e| e < params.created) {
        return Err(SignatureError::Malformed);
    }
    Ok(Candidate { label: label.to_owned(), covered, params, inner: inner.clone() })
}

/// RFC 9421 §2.5: the signature base.
fn signature_base(
    request: &SignedRequest<'_>,
    covered: &[String],
    inner: &InnerList,
) -> Result<String, SignatureError> {
    let mut base = String::new();
    for name in covered {
        let value = request.component(name)?;
        if value.contains(['\n', '\r']) {
            return Err(SignatureError::Malformed);
        }
        writeln!(base, "\"{name}\": {value}").expect("writing to a String");
    }
    let params = List::from([ListEntry::InnerList(inner.clone())]).serialize().ok_or(SignatureError::Malformed)?;
    write!(base, "\"@signature-params\": {params}").expect("writing to a String");
    Ok(base)
}

/// Verifies the request's signatures against `source`'s keys: the first
/// Signature-Input member that names one of its keys, covers what `policy`
/// requires, is within the time window and verifies, wins. The error is
/// the first member's when none does.
pub fn verify(
    request: &SignedRequest<'_>,
    source: &SourceService,
    policy: &SignaturePolicy,
    now_unix_s: i64,
) -> Result<Verified, SignatureError> {
    let inputs = parse_dictionary(request.headers, HEADER_SIGNATURE_INPUT)?;
    let signatures = parse_dictionary(request.headers, HEADER_SIGNATURE)?;
    let mut first_error = None;
    for (label, entry) in &inputs {
        match verify_one(request, source, policy, now_unix_s, label.as_str(), entry, &signatures) {
            Ok(verified) => return Ok(verified),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or(SignatureError::Missing))
}

fn verify_one(
    request: &SignedRequest<'_>,
    source: &SourceService,
    policy: &SignaturePolicy,
    now: i64,
    label: &str,
    entry: &ListEntry,
    signatures: &Dictionary,
) -> Result<Verified, SignatureError> {
    let c = candidate(label, entry)?;
    let covers = |name: &str| c.covered.iter().any(|x| x == name);
    if !policy.required.iter().all(|r| covers(r)) || !TARGET_COMPONENTS.iter().any(|t| covers(t)) {
        return Err(SignatureError::NotCovered);
    }
    let key = source.key(&c.params.key_id).ok_or(SignatureError::UnknownKey)?;
    let skew = i64::try_from(policy.skew.as_secs()).unwrap_or(i64::MAX);
    let max_age = i64::try_from(policy.max_age.as_secs()).unwrap_or(i64::MAX);
    if c.params.created > now.saturating_add(skew) {
        return Err(SignatureError::FromFuture);
    }
    if now > c.params.created.saturating_add(max_age).saturating_add(skew)
        || c.params.expires.is_some_and(|e| now > e.saturating_add(skew))
    {
        return Err(SignatureError::Stale);
    }
    let signature = match signatures.iter().find(|(l, _)| l.as_str() == label) {
        Some((_, ListEntry::Item(item))) => item.bare_item.as_byte_sequence().ok_or(SignatureError::Malformed)?,
        Some(_) => return Err(SignatureError::Malformed),
        None => return Err(SignatureError::Missing),
    };
    let base = signature_base(request, &c.covered, &c.inner)?;
    UnparsedPublicKey::new(&ED25519, &key.public_key)
        .verify(base.as_bytes(), signature)
        .map_err(|_| SignatureError::Mismatch)?;
    Ok(Verified { label: c.label, key_id: c.params.key_id, created: c.params.created })
}

/// Signs `request` over `covered` with the Ed25519 key of `seed`; returns the
/// `Signature-Input` and `Signature` header values for `label`.
pub fn sign(
    request: &SignedRequest<'_>,
    covered: &[&str],
    params: &SignatureParams,
    label: &str,
    seed: &[u8; 32],
) -> Result<(String, String), SignatureError> {
    let mut inner = InnerList::new(Vec::new());
    for name in covered {
        if !valid_component_name(name) {
            return Err(SignatureError::UnsupportedComponent);
        }
        let name = sfv::String::from_string((*name).to_owned()).map_err(|_| SignatureError::UnsupportedComponent)?;
        inner.items.push(Item::new(name));
    }
    let key = |k: &str| sfv::Key::from_string(k.to_owned()).expect("a valid key");
    let string = |s: &str| sfv::String::from_string(s.to_owned()).map_err(|_| SignatureError::Malformed);
    inner
        .params
        .insert(key("created"), BareItem::Integer(params.created.try_into().map_err(|_| SignatureError::Malformed)?));
    inner.params.insert(key("keyid"), BareItem::String(string(&params.key_id)?));
    if params.alg {
        inner.params.insert(key("alg"), BareItem::String(string("ed25519")?));
    }
    if let Some(expires) = params.expires {
        inner
            .params
            .insert(key("expires"), BareItem::Integer(expires.try_into().map_err(|_| SignatureError::Malformed)?));
    }
    if let Some(nonce) = &params.nonce {
        inner.params.insert(key("nonce"), BareItem::String(string(nonce)?));
    }
    if let Some(tag) = &params.tag {
        inner.params.insert(key("tag"), BareItem::String(string(tag)?));
    }
    let covered: Vec<String> = covered.iter().map(|s| (*s).to_owned()).collect();
    let base = signature_base(request, &covered, &inner)?;
    let pair = Ed25519KeyPair::from_seed_unchecked(seed).map_err(|_| SignatureError::Malformed)?;
    let signature = pair.sign(base.as_bytes());
    let params = List::from([ListEntry::InnerList(inner)]).serialize().ok_or(SignatureError::Malformed)?;
    Ok((format!("{label}={params}"), format!("{label}=:{}:", STANDARD.encode(signature.as_ref()))))
}

/// The Ed25519 public key of `seed` (a JWK `x` once base64url-encoded).
pub fn public_key(seed: &[u8; 32]) -> [u8; 32] {
    let pair = Ed25519KeyPair::from_seed_unchecked(seed).expect("any 32-byte seed");
    pair.public_key().as_ref().try_into().expect("32 bytes")
}

/// Why a body does not match its `Content-Digest` (400: the body is not
/// the one that was signed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("Content-Digest is missing")]
    Missing,
    #[error("Content-Digest is malformed")]
    Malformed,
    #[error("Content-Digest names neither sha-256 nor sha-512")]
    NoSupportedAlgorithm,
    #[error("the body does not match its Content-Digest")]
    Mismatch,
}

/// RFC 9530: every `sha-256` / `sha-512` member present must match the
/// body, and at least one must be present; other algorithms are ignored.
pub fn verify_content_digest(headers: &http::HeaderMap, body: &[u8]) -> Result<(), DigestError> {
    let dict = parse_dictionary(headers, HEADER_CONTENT_DIGEST).map_err(|e| match e {
        SignatureError::Missing => DigestError::Missing,
        _ => DigestError::Malformed,
    })?;
    let mut checked = false;
    for (alg, entry) in &dict {
        let expected: Vec<u8> = match alg.as_str() {
            "sha-256" => Sha256::digest(body).to_vec(),
            "sha-512" => Sha512::digest(body).to_vec(),
            _ => continue,
        };
        let ListEntry::Item(item) = entry else { return Err(DigestError::Malformed) };
        let got = item.bare_item.as_byte_sequence().ok_or(DigestError::Malformed)?;
        if !bool::from(got.ct_eq(&expected)) {
            return Err(DigestError::Mismatch);
        }
        checked = true;
    }
    if checked { Ok(()) } else { Err(DigestError::NoSupportedAlgorithm) }
}

/// The `Content-Digest` value of a body (sha-256).
pub fn content_digest(body: &[u8]) -> String {
    format!("sha-256=:{}:", STANDARD.encode(Sha256::digest(body)))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceService {
    /// The `Source-Service-ID` this Station sends.
    pub id: ServiceId,
    /// Its RFC 9421 keys; several let it rotate.
    pub keys: Vec<ServiceKey>,
    /// Its routes are `traffic_metadata_hardened`.
    #[serde(default)]
    pub hardened: bool,
}

impl SourceService {
    pub fn key(&self, key_id: &str) -> Option<&ServiceKey> {
        self.keys.iter().find(|k| k.key_id == key_id)
    }
}

/// An Ed25519 public key, as the `x` of its JWK (unpadded base64url of the
/// 32 raw bytes).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceKey {
    /// The RFC 9421 `keyid` that names it.
    pub key_id: String,
    #[serde(deserialize_with = "ed25519_public_key")]
    pub public_key: [u8; 32],
}

fn ed25519_public_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
    let text = String::deserialize(d)?;
    URL_SAFE_NO_PAD
        .decode(text.as_bytes())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| serde::de::Error::custom("public_key must be the unpadded base64url of 32 bytes (a JWK x)"))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::ServiceKey;
    use super::*;
    use crate::domain::ServiceId;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn source(key_id: &str, public_key: [u8; 32]) -> SourceService {
        SourceService {
            id: ServiceId::parse("did:web:station.example").unwrap(),
            keys: vec![ServiceKey { key_id: key_id.into(), public_key }],
            hardened: false,
        }
    }

    fn jwk_x(x: &str) -> [u8; 32] {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(x).unwrap().try_into().unwrap()
    }

    // ---- RFC 9421 Appendix B.2.6 (Ed25519), with the B.1.4 test key.

    const B26_X: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";
    /// B.1.4's private key (PKCS#8 `MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF`): its seed.
    const B26_SEED: &str = "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU";
    const B26_INPUT: &str = r#"sig-b26=("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519""#;
    const B26_SIGNATURE: &str =
        "sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:";

    fn b2_headers(extra: &[(&'static str, &str)]) -> HeaderMap {
        let mut pairs = vec![
            ("host", "example.com"),
            ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
            ("content-type", "application/json"),
            (
                "content-digest",
                "sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:",
            ),
            ("content-length", "18"),
        ];
        pairs.extend_from_slice(extra);
        headers(&pairs)
    }

    fn b2_request(headers: &HeaderMap) -> SignedRequest<'_> {
        SignedRequest {
            method: "POST",
            scheme: "https",
            authority: "example.com",
            path_and_query: "/foo?param=Value&Pet=dog",
            headers,
        }
    }

    /// B.2.6 covers neither the target's full set nor our headers: its own
    /// policy is just what it covers.
    const B26_POLICY: SignaturePolicy = SignaturePolicy {
        required: &["date", "@method", "@authority", "content-type", "content-length"],
        max_age: Duration::from_secs(300),
        skew: Duration::from_secs(30),
    };

    #[test]
    fn rfc_9421_b_2_6_verifies() {
        assert_eq!(public_key(&jwk_x(B26_SEED)), jwk_x(B26_X));
        let h = b2_headers(&[("signature-input", B26_INPUT), ("signature", B26_SIGNATURE)]);
        let v =
            verify(&b2_request(&h), &source("test-key-ed25519", jwk_x(B26_X)), &B26_POLICY, 1618884473 + 10).unwrap();
        assert_eq!((v.label.as_str(), v.key_id.as_str(), v.created), ("sig-b26", "test-key-ed25519", 1618884473));
    }

    #[test]
    fn rfc_9421_b_2_6_is_reproduced_by_sign() {
        let h = b2_headers(&[]);
        let params = SignatureParams {
            created: 1618884473,
            expires: None,
            key_id: "test-key-ed25519".into(),
            alg: false,
            nonce: None,
            tag: None,
        };
        let covered = ["date", "@method", "@path", "@authority", "content-type", "content-length"];
        let (input, signature) = sign(&b2_request(&h), &covered, &params, "sig-b26", &jwk_x(B26_SEED)).unwrap();
        assert_eq!(input, B26_INPUT);
        assert_eq!(signature, B26_SIGNATURE);
        // The signature base, as printed in B.2.6.
        let dict: Dictionary = Parser::new(B26_INPUT).parse().unwrap();
        let c = candidate("sig-b26", &dict[0]).unwrap();
        assert_eq!(
            signature_base(&b2_request(&h), &c.covered, &c.inner).unwrap(),
            "\"date\": Tue, 20 Apr 2021 02:07:55 GMT\n\"@method\": POST\n\"@path\": /foo\n\"@authority\": example.com\n\
             \"content-type\": application/json\n\"content-length\": 18\n\"@signature-params\": (\"date\" \"@method\" \
             \"@path\" \"@authority\" \"content-type\" \"content-length\");created=1618884473;keyid=\"test-key-ed25519\""
        );
    }

    #[test]
    fn rfc_9421_b_2_6_tampered_fails() {
        let policy = &B26_POLICY;
        let key = source("test-key-ed25519", jwk_x(B26_X));
        let now = 1618884473;
        let tampered = b2_headers(&[("signature-input", B26_INPUT), ("signature", B26_SIGNATURE)]);
        let mut moved = b2_request(&tampered);
        moved.path_and_query = "/bar";
        assert_eq!(verify(&moved, &key, policy, now), Err(SignatureError::Mismatch));
        let mut h = b2_headers(&[("signature-input", B26_INPUT), ("signature", B26_SIGNATURE)]);
        h.insert("content-length", HeaderValue::from_static("19"));
        assert_eq!(verify(&b2_request(&h), &key, policy, now), Err(SignatureError::Mismatch));
        // A repeated Date line changes the covered value.
        let mut h = b2_headers(&[("signature-input", B26_INPUT), ("signature", B26_SIGNATURE)]);
        h.append("date", HeaderValue::from_static("x"));
        assert_eq!(verify(&b2_request(&h), &key, policy, now), Err(SignatureError::Mismatch));
    }

    // ---- A notify signed by Python's http-message-signatures 3.0.0
    // (testdata/signature_vectors.py; seed 0x01..0x20).

    const PY_X: &str = "ebVWLo_mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ";
    const PY_DIGEST: &str = "sha-256=:FOecaI2HWo0NMFLBADNwGFbFyBS6Z2qTc91XmeXAKX0=:";
    const PY_INPUT: &str = r#"sig1=("@method" "@target-uri" "arkret-operation" "idempotency-key" "source-service-id" "destination-service-id" "content-digest");created=1760600000;keyid="station-key-1";alg="ed25519";expires=1760600300"#;
    const PY_SIGNATURE: &str =
        "sig1=:yKRVba7LydkzxEjH3hnHhJP3tJFIVQ47HDEEawZCk7rvW6Gco0RB+hB7W0ABrGBL8xuO1OrzZ3FJ082aYx5fBQ==:";
    const PY_BODY: &[u8] = br#"{"notification":{"push_target_id":"ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8","wakeup_kind":"message","devices":[{"device_id":"ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f"}]}}"#;

    fn py_seed() -> [u8; 32] {
        std::array::from_fn(|i| i as u8 + 1)
    }

    fn notify_headers(extra: &[(&'static str, &str)]) -> HeaderMap {
        let mut pairs = vec![
            ("content-type", "application/json"),
            ("arkret-operation", "ak.edge.push.command.notify.v1"),
            ("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
            ("source-service-id", "did:web:station.example"),
            ("destination-service-id", "did:web:push.example"),
            ("content-digest", PY_DIGEST),
        ];
        pairs.extend_from_slice(extra);
        headers(&pairs)
    }

    fn notify_request(headers: &HeaderMap) -> SignedRequest<'_> {
        SignedRequest {
            method: "POST",
            scheme: "https",
            authority: "push.example",
            path_and_query: "/_arkret/edge/push/notify",
            headers,
        }
    }

    fn policy() -> SignaturePolicy {
        SignaturePolicy::notify(Duration::from_secs(300), Duration::from_secs(30))
    }

    #[test]
    fn python_signed_notify_verifies() {
        assert_eq!(public_key(&py_seed()), jwk_x(PY_X));
        assert_eq!(content_digest(PY_BODY), PY_DIGEST);
        let h = notify_headers(&[("signature-input", PY_INPUT), ("signature", PY_SIGNATURE)]);
        assert_eq!(verify_content_digest(&h, PY_BODY), Ok(()));
        let v = verify(&notify_request(&h), &source("station-key-1", jwk_x(PY_X)), &policy(), 1760600010).unwrap();
        assert_eq!(v.key_id, "station-key-1");
    }

    #[test]
    fn sign_matches_python_byte_for_byte() {
        let h = notify_headers(&[]);
        let params = SignatureParams {
            created: 1760600000,
            expires: Some(1760600300),
            key_id: "station-key-1".into(),
            alg: true,
            nonce: None,
            tag: None,
        };
        let covered = [
            "@method",
            "@target-uri",
            "arkret-operation",
            "idempotency-key",
            "source-service-id",
            "destination-service-id",
            "content-digest",
        ];
        let (input, signature) = sign(&notify_request(&h), &covered, &params, "sig1", &py_seed()).unwrap();
        // `sign` emits created;keyid;alg;expires, Python's order: the same
        // base, and Ed25519 is deterministic.
        assert_eq!(input, PY_INPUT);
        assert_eq!(signature, PY_SIGNATURE);
    }

    #[test]
    fn the_time_window() {
        let h = notify_headers(&[("signature-input", PY_INPUT), ("signature", PY_SIGNATURE)]);
        let key = source("station-key-1", jwk_x(PY_X));
        let at = |now| verify(&notify_request(&h), &key, &policy(), now).map(|_| ());
        let created = 1760600000;
        assert_eq!(at(created - 30), Ok(()), "within the skew ahead");
        assert_eq!(at(created - 31), Err(SignatureError::FromFuture));
        // expires = created + 300 (+ 30 skew) comes before max_age + skew.
        assert_eq!(at(created + 330), Ok(()));
        assert_eq!(at(created + 331), Err(SignatureError::Stale));
        let short = SignaturePolicy::notify(Duration::from_secs(60), Duration::from_secs(0));
        assert_eq!(verify(&notify_request(&h), &key, &short, created + 61).map(|_| ()), Err(SignatureError::Stale));
    }

    #[test]
    fn refusals() {
        let key = source("station-key-1", jwk_x(PY_X));
        let now = 1760600010;
        let check = |extra: &[(&'static str, &str)]| {
            let h = notify_headers(extra);
            verify(&notify_request(&h), &key, &policy(), now).map(|_| ())
        };
        assert_eq!(check(&[]), Err(SignatureError::Missing));
        assert_eq!(check(&[("signature-input", PY_INPUT)]), Err(SignatureError::Missing));
        assert_eq!(
            check(&[("signature-input", "sig1=("), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::Malformed)
        );
        // Another key id.
        let other_key = PY_INPUT.replace("station-key-1", "station-key-2");
        assert_eq!(
            check(&[("signature-input", &other_key), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::UnknownKey)
        );
        // Another algorithm.
        let rsa = PY_INPUT.replace(r#"alg="ed25519""#, r#"alg="rsa-pss-sha512""#);
        assert_eq!(
            check(&[("signature-input", &rsa), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::UnsupportedAlgorithm)
        );
        // No created.
        let no_created = PY_INPUT.replace(";created=1760600000", "");
        assert_eq!(
            check(&[("signature-input", &no_created), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::Malformed)
        );
        // Not covering idempotency-key or the target.
        for drop in [r#" "idempotency-key""#, r#" "@target-uri""#, r#" "content-digest""#] {
            let input = PY_INPUT.replace(drop, "");
            assert_eq!(
                check(&[("signature-input", &input), ("signature", PY_SIGNATURE)]),
                Err(SignatureError::NotCovered)
            );
        }
        // A component with parameters.
        let sf = PY_INPUT.replace(r#""content-digest""#, r#""content-digest";sf"#);
        assert_eq!(
            check(&[("signature-input", &sf), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::UnsupportedComponent)
        );
        // A repeated component.
        let twice = PY_INPUT.replace(r#""@method""#, r#""@method" "@method""#);
        assert_eq!(check(&[("signature-input", &twice), ("signature", PY_SIGNATURE)]), Err(SignatureError::Malformed));
        // A covered header the request lacks.
        let extra = PY_INPUT.replace(r#""@method""#, r#""@method" "x-missing""#);
        assert_eq!(
            check(&[("signature-input", &extra), ("signature", PY_SIGNATURE)]),
            Err(SignatureError::ComponentAbsent)
        );
        // A signature for another label only.
        let other_label = PY_SIGNATURE.replace("sig1=", "sig2=");
        assert_eq!(check(&[("signature-input", PY_INPUT), ("signature", &other_label)]), Err(SignatureError::Missing));
    }

    #[test]
    fn every_covered_header_is_bound() {
        let key = source("station-key-1", jwk_x(PY_X));
        for (name, value) in [
            ("arkret-operation", "ak.edge.push.command.register_device.v1"),
            ("idempotency-key", "another-key"),
            ("source-service-id", "did:web:evil.example"),
            ("destination-service-id", "did:web:other-gateway.example"),
            ("content-digest", "sha-256=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:"),
        ] {
            let mut h = notify_headers(&[("signature-input", PY_INPUT), ("signature", PY_SIGNATURE)]);
            h.insert(name, HeaderValue::from_str(value).unwrap());
            assert_eq!(
                verify(&notify_request(&h), &key, &policy(), 1760600010).map(|_| ()),
                Err(SignatureError::Mismatch),
                "{name}"
            );
        }
        let h = notify_headers(&[("signature-input", PY_INPUT), ("signature", PY_SIGNATURE)]);
        let mut other_host = notify_request(&h);
        other_host.authority = "push.example:8443";
        assert_eq!(verify(&other_host, &key, &policy(), 1760600010).map(|_| ()), Err(SignatureError::Mismatch));
        let mut get = notify_request(&h);
        get.method = "GET";
        assert_eq!(verify(&get, &key, &policy(), 1760600010).map(|_| ()), Err(SignatureError::Mismatch));
    }

    #[test]
    fn a_second_signature_of_another_signer_does_not_hide_ours() {
        let key = source("station-key-1", jwk_x(PY_X));
        let input = format!(r#"other=("@method");created=1760600000;keyid="someone-else", {PY_INPUT}"#);
        let signature = format!("other=:AAAA:, {PY_SIGNATURE}");
        let h = notify_headers(&[("signature-input", &input), ("signature", &signature)]);
        assert_eq!(verify(&notify_request(&h), &key, &policy(), 1760600010).unwrap().label, "sig1");
    }

    #[test]
    fn signatures_made_here_verify_here() {
        let seed = [7u8; 32];
        let key = source("k", public_key(&seed));
        let h = notify_headers(&[]);
        let params = SignatureParams {
            created: 1000,
            expires: None,
            key_id: "k".into(),
            alg: true,
            nonce: None,
            tag: Some("arkret".into()),
        };
        let mut covered = SignaturePolicy::NOTIFY.to_vec();
        covered.push("@path");
        let (input, signature) = sign(&notify_request(&h), &covered, &params, "s", &seed).unwrap();
        let mut h = h;
        h.insert("signature-input", HeaderValue::from_str(&input).unwrap());
        h.insert("signature", HeaderValue::from_str(&signature).unwrap());
        assert!(verify(&notify_request(&h), &key, &policy(), 1000).is_ok());
        // Another key does not verify it.
        let wrong = source("k", public_key(&[8u8; 32]));
        assert_eq!(verify(&notify_request(&h), &wrong, &policy(), 1000), Err(SignatureError::Mismatch));
    }

    #[test]
    fn content_digests() {
        let body = br#"{"hello": "world"}"#;
        // The digests of RFC 9421 B.2's request body (its sha-512 is B.2's header).
        let sha256 = "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:";
        let sha512 =
            "sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:";
        assert_eq!(content_digest(body), sha256);
        let check = |v: &str| verify_content_digest(&headers(&[("content-digest", v)]), body);
        assert_eq!(check(sha256), Ok(()));
        assert_eq!(check(sha512), Ok(()));
        assert_eq!(check(&format!("{sha256}, {sha512}")), Ok(()));
        assert_eq!(check(&format!("{sha256}, md5=:AAAA:")), Ok(()));
        assert_eq!(check("md5=:AAAA:"), Err(DigestError::NoSupportedAlgorithm));
        assert_eq!(check(&content_digest(b"other")), Err(DigestError::Mismatch));
        assert_eq!(check(&format!("{sha256}, sha-512=:AAAA:")), Err(DigestError::Mismatch));
        assert_eq!(check("sha-256=X48E9"), Err(DigestError::Malformed));
        assert_eq!(check("sha-256=(:AAAA:)"), Err(DigestError::Malformed));
        assert_eq!(verify_content_digest(&HeaderMap::new(), body), Err(DigestError::Missing));
    }
}
