//! A browser's side of Web Push, written from the receiver's point of view
//! (the engine's sender side lives in `fanout_engine::channel::webpush`):
//! a subscription's key pair and auth secret, RFC 8291 / RFC 8188 decryption
//! of an `aes128gcm` body, and the RFC 8292 VAPID check a push service makes.

use anyhow::{Context, anyhow, bail, ensure};
use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::agreement::{self, ECDH_P256, PrivateKey, UnparsedPublicKey};
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey as SignatureKey};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hkdf::Hkdf;
use sha2::Sha256;

/// A subscription as a browser holds it: the ECDH private key behind
/// `p256dh` and the `auth` secret.
pub struct Subscriber {
    private: PrivateKey,
    p256dh: Vec<u8>,
    auth: [u8; 16],
}

impl Subscriber {
    /// A fresh subscription.
    pub fn generate() -> Self {
        let private = PrivateKey::generate(&ECDH_P256).expect("P-256 key generation");
        let mut auth = [0; 16];
        aws_lc_rs::rand::fill(&mut auth).expect("random auth secret");
        Self::from_key(private, auth)
    }

    /// A subscription with a given 32-byte private scalar (RFC 8291's example).
    pub fn from_private_key(scalar: &[u8], auth: [u8; 16]) -> anyhow::Result<Self> {
        let private = PrivateKey::from_private_key(&ECDH_P256, scalar).map_err(|e| anyhow!("private key: {e}"))?;
        Ok(Self::from_key(private, auth))
    }

    fn from_key(private: PrivateKey, auth: [u8; 16]) -> Self {
        let p256dh = private.compute_public_key().expect("public key").as_ref().to_vec();
        Self { private, p256dh, auth }
    }

    /// The uncompressed public key (65 bytes).
    pub fn p256dh(&self) -> Vec<u8> {
        self.p256dh.clone()
    }

    pub fn auth(&self) -> &[u8; 16] {
        &self.auth
    }

    /// `p256dh` as unpadded base64url, as a browser's `getKey` is sent.
    pub fn p256dh_base64url(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.p256dh)
    }

    pub fn auth_base64url(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.auth)
    }
}

/// Opens an `aes128gcm` body (RFC 8188 section 2) for `subscriber` (RFC
/// 8291 section 3.4: the key id is the sender's public key). Accepts any
/// record size and several records, and strips padding.
pub fn decrypt(subscriber: &Subscriber, body: &[u8]) -> anyhow::Result<Vec<u8>> {
    ensure!(body.len() >= 21, "shorter than the aes128gcm header");
    let salt = &body[..16];
    let rs = u32::from_be_bytes(body[16..20].try_into()?) as usize;
    let idlen = body[20] as usize;
    ensure!(rs >= 18, "record size below 18");
    let keyid = body.get(21..21 + idlen).context("truncated key id")?;
    let records = &body[21 + idlen..];
    ensure!(!records.is_empty(), "no record");

    let sender = UnparsedPublicKey::new(&ECDH_P256, keyid);
    let ikm = agreement::agree(&subscriber.private, sender, anyhow!("ECDH failed"), |secret| {
        let prk = Hkdf::<Sha256>::new(Some(&subscriber.auth), secret);
        let info = [b"WebPush: info\0".as_slice(), &subscriber.p256dh, keyid].concat();
        let mut ikm = [0; 32];
        prk.expand(&info, &mut ikm).map_err(|_| anyhow!("hkdf"))?;
        Ok(ikm)
    })?;
    let hkdf = Hkdf::<Sha256>::new(Some(salt), &ikm);
    let mut cek = [0; 16];
    let mut base_nonce = [0; 12];
    hkdf.expand(b"Content-Encoding: aes128gcm\0", &mut cek).map_err(|_| anyhow!("hkdf"))?;
    hkdf.expand(b"Content-Encoding: nonce\0", &mut base_nonce).map_err(|_| anyhow!("hkdf"))?;
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &cek).map_err(|_| anyhow!("cek"))?);

    let mut plaintext = Vec::new();
    let chunks: Vec<&[u8]> = records.chunks(rs).collect();
    for (seq, chunk) in chunks.iter().enumerate() {
        // RFC 8188 section 2.3: the nonce is the base XOR the sequence number.
        let mut nonce = base_nonce;
        for (i, b) in (seq as u64).to_be_bytes().iter().enumerate() {
            nonce[4 + i] ^= b;
        }
        let mut record = chunk.to_vec();
        let open = key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut record)
            .map_err(|_| anyhow!("record {seq} does not authenticate"))?;
        // Padding is zeros after the delimiter: 0x02 ends the last record, 0x01 any other.
        let end = open.iter().rposition(|&b| b != 0).context("a record without a delimiter")?;
        let last = seq + 1 == chunks.len();
        match (open[end], last) {
            (0x02, true) | (0x01, false) => plaintext.extend_from_slice(&open[..end]),
            _ => bail!("record {seq} has the wrong delimiter"),
        }
    }
    Ok(plaintext)
}

/// What a valid RFC 8292 `Authorization: vapid t=..., k=...` carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vapid {
    pub aud: String,
    pub exp: u64,
    pub sub: Option<String>,
    /// `k`: the application server's public key, base64url.
    pub key: String,
}

/// Checks an Authorization header as a push service does (RFC 8292 sections
/// 2 and 3): the `vapid` scheme, an ES256 JWT whose signature verifies with
/// `k`, and its claims. Checks neither `aud` nor `exp` against anything: the
/// caller compares them.
pub fn check_vapid(authorization: &str) -> anyhow::Result<Vapid> {
    let params = authorization.strip_prefix("vapid ").context("not the vapid scheme")?;
    let mut token = None;
    let mut key = None;
    for param in params.split(',') {
        match param.trim().split_once('=') {
            Some(("t", v)) => token = Some(v),
            Some(("k", v)) => key = Some(v),
            _ => bail!("unknown vapid parameter"),
        }
    }
    let (token, key) = (token.context("no t")?, key.context("no k")?);
    let public = URL_SAFE_NO_PAD.decode(key).context("k is not base64url")?;
    ensure!(public.len() == 65 && public[0] == 4, "k is not an uncompressed P-256 point");
    let (signed, signature) = token.rsplit_once('.').context("not a JWT")?;
    let (header, claims) = signed.split_once('.').context("not a JWT")?;
    let signature = URL_SAFE_NO_PAD.decode(signature).context("signature is not base64url")?;
    SignatureKey::new(&ECDSA_P256_SHA256_FIXED, &public)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| anyhow!("the JWT signature does not verify with k"))?;
    let header: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header)?)?;
    ensure!(header["alg"] == "ES256", "alg is not ES256");
    let claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims)?)?;
    Ok(Vapid {
        aud: claims["aud"].as_str().context("no aud")?.to_owned(),
        exp: claims["exp"].as_u64().context("no exp")?,
        sub: claims["sub"].as_str().map(str::to_owned),
        key: key.to_owned(),
    })
}

/// A VAPID key pair for tests: the PEM the engine reads, and the public key
/// a browser would subscribe with.
pub struct VapidTestKey {
    /// PKCS#8 `PRIVATE KEY` PEM.
    pub pem: String,
    /// The uncompressed public key, unpadded base64url (`k`).
    pub public_key: String,
}

impl VapidTestKey {
    pub fn generate() -> Self {
        use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).expect("P-256 key");
        Self {
            pem: crate::pki::pem("PRIVATE KEY", pkcs8.as_ref()),
            public_key: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
        }
    }

    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(path, &self.pem)
    }
}
