//! RFC 8291 message encryption: the `aes128gcm` content coding of RFC 8188
//! with a key from ECDH P-256 between a fresh sender key and the
//! subscription's `p256dh`, mixed with its `auth` secret by HKDF-SHA-256.
//!
//! Every message is one record (RFC 8291 section 4: the push service need
//! accept no more than 4096 bytes of body), so the sequence number is 0 and
//! the nonce is the derived one as it is.

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::agreement::{self, ECDH_P256, PrivateKey, UnparsedPublicKey};
use hkdf::Hkdf;
use sha2::Sha256;

use crate::domain::WebPushKeys;

/// RFC 8188 `rs`: the record size written in the header. With one record it
/// bounds the message, and 4096 is what every push service must accept.
pub const RECORD_SIZE: u32 = 4096;
const SALT_LEN: usize = 16;
const TAG_LEN: usize = 16;
/// salt(16) || rs(4) || idlen(1) || keyid = the sender's public key (65).
pub const HEADER_LEN: usize = SALT_LEN + 4 + 1 + WebPushKeys::P256DH_LEN;
/// The largest plaintext one record carries: the body is the header, the
/// plaintext, the last-record delimiter 0x02 and the tag (RFC 8188 2.1).
pub const MAX_PLAINTEXT: usize = RECORD_SIZE as usize - HEADER_LEN - 1 - TAG_LEN;

/// Why nothing was encrypted. Names no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncryptError {
    #[error("the payload exceeds one {RECORD_SIZE}-byte record")]
    TooLarge,
    #[error("the cryptographic library failed")]
    Crypto,
}

impl From<aws_lc_rs::error::Unspecified> for EncryptError {
    fn from(_: aws_lc_rs::error::Unspecified) -> Self {
        Self::Crypto
    }
}

/// Encrypts `plaintext` for the subscription with a fresh sender key pair
/// and salt: the whole request body.
pub fn encrypt(plaintext: &[u8], keys: &WebPushKeys) -> Result<Vec<u8>, EncryptError> {
    let sender = PrivateKey::generate(&ECDH_P256)?;
    let mut salt = [0; SALT_LEN];
    aws_lc_rs::rand::fill(&mut salt)?;
    encrypt_with(plaintext, keys, &sender, salt)
}

/// `encrypt` with the sender's key and salt given (tests reproduce RFC
/// 8291 appendix A with them).
fn encrypt_with(
    plaintext: &[u8],
    keys: &WebPushKeys,
    sender: &PrivateKey,
    salt: [u8; SALT_LEN],
) -> Result<Vec<u8>, EncryptError> {
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(EncryptError::TooLarge);
    }
    let sender_public = sender.compute_public_key()?;
    let sender_public = sender_public.as_ref();
    // RFC 8291 section 3.3: ecdh_secret, then IKM from auth and
    // "WebPush: info" || 0x00 || ua_public || as_public.
    let ua_public = UnparsedPublicKey::new(&ECDH_P256, keys.p256dh());
    let ikm = agreement::agree(sender, ua_public, EncryptError::Crypto, |ecdh_secret| {
        let mut info = Vec::with_capacity(14 + 2 * WebPushKeys::P256DH_LEN);
        info.extend_from_slice(b"WebPush: info\0");
        info.extend_from_slice(keys.p256dh());
        info.extend_from_slice(sender_public);
        let mut ikm = [0; 32];
        Hkdf::<Sha256>::new(Some(keys.auth()), ecdh_secret)
            .expand(&info, &mut ikm)
            .map_err(|_| EncryptError::Crypto)?;
        Ok(ikm)
    })?;
    // RFC 8188 section 2.2 and 2.3: the content key and nonce from the salt.
    let (cek, nonce) = content_key_and_nonce(&salt, &ikm)?;

    let mut body = Vec::with_capacity(HEADER_LEN + plaintext.len() + 1 + TAG_LEN);
    body.extend_from_slice(&salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(WebPushKeys::P256DH_LEN as u8);
    body.extend_from_slice(sender_public);
    let mut record = Vec::with_capacity(plaintext.len() + 1 + TAG_LEN);
    record.extend_from_slice(plaintext);
    // The last (and only) record's delimiter, no padding.
    record.push(0x02);
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &cek)?);
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut record)?;
    body.extend_from_slice(&record);
    Ok(body)
}

/// CEK = HKDF(salt, IKM, "Content-Encoding: aes128gcm" || 0x00, 16) and
/// NONCE = HKDF(salt, IKM, "Content-Encoding: nonce" || 0x00, 12).
fn content_key_and_nonce(salt: &[u8; SALT_LEN], ikm: &[u8]) -> Result<([u8; 16], [u8; 12]), EncryptError> {
    let hkdf = Hkdf::<Sha256>::new(Some(salt), ikm);
    let mut cek = [0; 16];
    let mut nonce = [0; 12];
    hkdf.expand(b"Content-Encoding: aes128gcm\0", &mut cek).map_err(|_| EncryptError::Crypto)?;
    hkdf.expand(b"Content-Encoding: nonce\0", &mut nonce).map_err(|_| EncryptError::Crypto)?;
    Ok((cek, nonce))
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use fanout_testkit::webpush::{Subscriber, decrypt};

    use super::*;

    fn b64(s: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(s).unwrap()
    }

    /// RFC 8291 appendix A, with its line breaks removed.
    const PLAINTEXT: &str = "V2hlbiBJIGdyb3cgdXAsIEkgd2FudCB0byBiZSBhIHdhdGVybWVsb24";
    const AS_PRIVATE: &str = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw";
    const AS_PUBLIC: &str = "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8";
    const UA_PRIVATE: &str = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94";
    const UA_PUBLIC: &str = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const SALT: &str = "DGv6ra1nlYgDCS1FRnbzlw";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";
    const BODY: &str = concat!(
        "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27ml",
        "mlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPT",
        "pK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
    );

    fn rfc_keys() -> WebPushKeys {
        WebPushKeys::parse(&b64(UA_PUBLIC), &b64(AUTH)).unwrap()
    }

    #[test]
    fn reproduces_rfc_8291_appendix_a_byte_for_byte() {
        let sender = PrivateKey::from_private_key(&ECDH_P256, &b64(AS_PRIVATE)).unwrap();
        assert_eq!(sender.compute_public_key().unwrap().as_ref(), &b64(AS_PUBLIC)[..]);
        let salt: [u8; 16] = b64(SALT).try_into().unwrap();
        let body = encrypt_with(&b64(PLAINTEXT), &rfc_keys(), &sender, salt).unwrap();
        assert_eq!(URL_SAFE_NO_PAD.encode(&body), BODY);
        assert_eq!(body, b64(BODY));
    }

    #[test]
    fn the_subscriber_decrypts_the_rfc_body_and_fresh_ones() {
        let ua = Subscriber::from_private_key(&b64(UA_PRIVATE), b64(AUTH).try_into().unwrap()).unwrap();
        assert_eq!(ua.p256dh(), b64(UA_PUBLIC));
        assert_eq!(decrypt(&ua, &b64(BODY)).unwrap(), b64(PLAINTEXT));

        // A fresh sender key and salt every time: two bodies of one
        // plaintext differ, and both decrypt.
        let ua = Subscriber::generate();
        let keys = WebPushKeys::parse(&ua.p256dh(), ua.auth()).unwrap();
        let wake = br#"{"topic":"AAECAw==","sequence_id":"42"}"#;
        let (a, b) = (encrypt(wake, &keys).unwrap(), encrypt(wake, &keys).unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), HEADER_LEN + wake.len() + 1 + TAG_LEN);
        assert_eq!(decrypt(&ua, &a).unwrap(), wake);
        assert_eq!(decrypt(&ua, &b).unwrap(), wake);
        // Another subscriber's keys cannot open it.
        assert!(decrypt(&Subscriber::generate(), &a).is_err());
    }

    #[test]
    fn one_record_is_the_limit() {
        let ua = Subscriber::generate();
        let keys = WebPushKeys::parse(&ua.p256dh(), ua.auth()).unwrap();
        let largest = vec![b'x'; MAX_PLAINTEXT];
        let body = encrypt(&largest, &keys).unwrap();
        assert_eq!(body.len(), RECORD_SIZE as usize);
        assert_eq!(decrypt(&ua, &body).unwrap(), largest);
        assert_eq!(encrypt(&[b'x'; MAX_PLAINTEXT + 1], &keys), Err(EncryptError::TooLarge));
    }
}
