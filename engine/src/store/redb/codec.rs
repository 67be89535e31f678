//! The record encodings: a version byte, then fixed-width big-endian integers
//! and u32-length-prefixed byte strings. Only the secret's SHA-256 is stored (PUSH-254).
//! Also the shard row and how a redb error becomes a `StoreError`.

use crate::domain::{
    Channel, DeliveryTarget, EnvelopeKind, KeyWindow, MAX_INLINE_DATA, MembershipChange, MessageId, Recipient,
    RecipientId, RegistrationInput, RelayMeta, RelayRegistration, SecretHash, SenderHmac, ShardId, SigningKey,
    StoredEnvelope, StoredSubscription, Subscription, Topic, WebPushKeys, WebhookUrl,
};
use crate::store::StoreError;

/// redb errors carry no user data, so their text is safe in `Backend`.
pub(super) trait OrBackend<T> {
    fn be(self) -> Result<T, StoreError>;
}

impl<T, E: std::fmt::Display> OrBackend<T> for Result<T, E> {
    fn be(self) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Backend(e.to_string()))
    }
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Backend(format!("corrupt {what} record"))
}

/// A shard's row. `last` is the largest id handed out; since an append stores
/// its whole batch in one transaction, the boundary equals it after commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ShardRow {
    pub(super) boundary: u64,
    pub(super) checkpoint: u64,
    pub(super) last: u64,
}

const VERSION: u8 = 1;

pub(super) struct Writer(Vec<u8>);

impl Writer {
    pub(super) fn new() -> Self {
        Self(vec![VERSION])
    }
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(super) fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(super) fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    pub(super) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).expect("stored values are far below 4 GiB");
        self.0.extend_from_slice(&len.to_be_bytes());
        self.raw(v)
    }
    /// An optional text: 0 (absent), or 1 and the text.
    pub(super) fn opt(&mut self, v: Option<&str>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).bytes(v.as_bytes()),
        }
    }
    pub(super) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

pub(super) struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8], what: &'static str) -> Result<Self, StoreError> {
        let mut r = Self { buf, what };
        if r.u8()? != VERSION {
            return Err(StoreError::Backend(format!("unknown {what} record version")));
        }
        Ok(r)
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.buf.len() < n {
            return Err(corrupt(self.what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    pub(super) fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, StoreError> {
        self.array().map(u32::from_be_bytes)
    }
    pub(super) fn u64(&mut self) -> Result<u64, StoreError> {
        self.array().map(u64::from_be_bytes)
    }
    pub(super) fn i64(&mut self) -> Result<i64, StoreError> {
        self.array().map(i64::from_be_bytes)
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let len = u32::from_be_bytes(self.array()?);
        self.take(len as usize)
    }
    pub(super) fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| corrupt(self.what))
    }
    /// What `Writer::opt` wrote.
    pub(super) fn opt(&mut self) -> Result<Option<String>, StoreError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.string().map(Some),
            _ => Err(corrupt(self.what)),
        }
    }
    /// A text that must parse as `T` again: one that no longer does is a
    /// corrupt record.
    pub(super) fn parsed<T, E>(&mut self, parse: impl FnOnce(&str) -> Result<T, E>) -> Result<T, StoreError> {
        parse(&self.string()?).map_err(|_| corrupt(self.what))
    }
    pub(super) fn end(&self) -> Result<(), StoreError> {
        if self.buf.is_empty() { Ok(()) } else { Err(corrupt(self.what)) }
    }
}

pub(super) fn encode_recipient(r: &Recipient) -> Vec<u8> {
    let mut w = Writer::new();
    w.raw(&r.secret_hash.0).i64(r.renewed_at_ns).u64(r.topic_count).u8(r.target.channel().storage_tag());
    match &r.target {
        DeliveryTarget::Apns { token } | DeliveryTarget::Fcm { token } => w.bytes(token.as_bytes()),
        #[cfg(test)]
        DeliveryTarget::Probe { token } => w.bytes(token.as_bytes()),
        DeliveryTarget::Http { url, signing_key } => w.bytes(url.as_str().as_bytes()).bytes(signing_key.as_bytes()),
        DeliveryTarget::WebPush { endpoint, keys } => {
            w.bytes(endpoint.as_str().as_bytes()).bytes(keys.p256dh()).bytes(keys.auth())
        }
        // Spec 003 §1: optional fields as 0 (absent) or 1 and the value.
        // No registration (003 §1, removed): an empty provider, which a
        // registration never has, and nothing after it.
        DeliveryTarget::Relay(None) => w.bytes(b""),
        DeliveryTarget::Relay(Some(r)) => {
            w.bytes(r.provider().as_bytes()).bytes(r.token().as_bytes());
            w.opt(r.app_id()).opt(r.p256dh()).opt(r.auth());
            w.u8(match r.sandbox() {
                None => 0,
                Some(false) => 1,
                Some(true) => 2,
            })
        }
    };
    w.finish()
}

fn decode_relay(r: &mut Reader<'_>) -> Result<Option<RelayRegistration>, StoreError> {
    let what = r.what;
    let provider = r.string()?;
    if provider.is_empty() {
        return Ok(None);
    }
    let token = r.string()?;
    let (app_id, p256dh, auth) = (r.opt()?, r.opt()?, r.opt()?);
    let sandbox = match r.u8()? {
        0 => None,
        1 => Some(false),
        2 => Some(true),
        _ => return Err(corrupt(what)),
    };
    RelayRegistration::parse(RegistrationInput {
        provider: &provider,
        token: &token,
        app_id: app_id.as_deref(),
        sandbox,
        p256dh: p256dh.as_deref(),
        auth: auth.as_deref(),
    })
    .map(Some)
    .map_err(|_| corrupt(what))
}

pub(super) fn decode_recipient(id: RecipientId, buf: &[u8]) -> Result<Recipient, StoreError> {
    const WHAT: &str = "recipient";
    let mut r = Reader::new(buf, WHAT)?;
    let secret_hash = SecretHash(r.array()?);
    let renewed_at_ns = r.i64()?;
    let topic_count = r.u64()?;
    let target = match Channel::from_storage_tag(r.u8()?).ok_or_else(|| corrupt(WHAT))? {
        Channel::Apns => DeliveryTarget::Apns { token: r.string()? },
        Channel::Fcm => DeliveryTarget::Fcm { token: r.string()? },
        #[cfg(test)]
        Channel::Probe => DeliveryTarget::Probe { token: r.string()? },
        Channel::Http => DeliveryTarget::Http {
            url: WebhookUrl::parse(&r.string()?).map_err(|_| corrupt(WHAT))?,
            signing_key: SigningKey::parse(r.bytes()?).map_err(|_| corrupt(WHAT))?,
        },
        Channel::Relay => DeliveryTarget::Relay(decode_relay(&mut r)?),
        Channel::WebPush => {
            let endpoint = WebhookUrl::parse(&r.string()?).map_err(|_| corrupt(WHAT))?;
            let p256dh = r.bytes()?;
            let keys = WebPushKeys::parse(p256dh, r.bytes()?).map_err(|_| corrupt(WHAT))?;
            DeliveryTarget::WebPush { endpoint, keys }
        }
    };
    r.end()?;
    Ok(Recipient { id, secret_hash, target, renewed_at_ns, topic_count })
}

/// The topic is part of both keys, so the value leaves it out.
pub(super) fn encode_subscription(s: &StoredSubscription) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(s.start_position).u8(u8::from(s.subscription.include_commits));
    // Section 3: no epoch base is stored without keys.
    match &s.subscription.keys {
        None => w.u8(0),
        Some(window) => {
            let keys = window.keys();
            w.u8(u8::try_from(keys.len()).expect("at most 3 keys")).i64(window.epoch_base());
            for key in keys {
                w.raw(&key.0);
            }
            &mut w
        }
    };
    w.finish()
}

pub(super) fn decode_subscription(topic: Topic, buf: &[u8]) -> Result<StoredSubscription, StoreError> {
    const WHAT: &str = "subscription";
    let mut r = Reader::new(buf, WHAT)?;
    let start_position = r.u64()?;
    let include_commits = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(corrupt(WHAT)),
    };
    let keys = match r.u8()? {
        0 => None,
        n => {
            let base = r.i64()?;
            let keys = (0..n)
                .map(|_| r.array::<{ crate::domain::HMAC_KEY_LEN }>().map(|k| k.to_vec()))
                .collect::<Result<Vec<_>, _>>()?;
            KeyWindow::parse(base, &keys).map_err(|_| corrupt(WHAT))?
        }
    };
    r.end()?;
    Ok(StoredSubscription { subscription: Subscription { topic, keys, include_commits }, start_position })
}

/// Shard and sequence id are the key, so the value leaves them out. The
/// data (PUSH-230's HMAC input, empty when suppression cannot apply)
/// comes last, so a window read decodes the rest without copying it.
pub(super) fn encode_envelope(e: &StoredEnvelope, data: &[u8]) -> Vec<u8> {
    Writer::new()
        .bytes(e.topic.as_bytes())
        .u8(e.kind as u8)
        .i64(e.server_ts_ns)
        // Empty without an HMAC: the format kept from before `SenderHmac`.
        .bytes(e.sender_hmac.as_ref().map_or(&[][..], |h| h.as_bytes()))
        .bytes(data)
        // Spec 003's metadata; records written before it end after data.
        .bytes(e.relay.message_id.as_ref().map_or(&b""[..], |m| m.as_str().as_bytes()))
        .u8(e.relay.membership.map_or(0, |m| m as u8))
        .finish()
}

/// The envelope without its data (windows do not hold it).
pub(super) fn decode_envelope(shard: ShardId, sequence_id: u64, buf: &[u8]) -> Result<StoredEnvelope, StoreError> {
    let (envelope, _data) = decode_envelope_parts(shard, sequence_id, buf)?;
    Ok(envelope)
}

/// The suppression input (PUSH-230), borrowed from the stored value:
/// empty unless the envelope kept a 32-byte sender HMAC (a small data
/// kept only for the relay's mls_message is not one).
pub(super) fn decode_envelope_data(buf: &[u8]) -> Result<&[u8], StoreError> {
    let (envelope, data) = decode_envelope_parts(ShardId::FIRST, 0, buf)?;
    Ok(if envelope.sender_hmac.is_some() { data } else { &[] })
}

fn decode_envelope_parts(shard: ShardId, sequence_id: u64, buf: &[u8]) -> Result<(StoredEnvelope, &[u8]), StoreError> {
    const WHAT: &str = "envelope";
    let mut r = Reader::new(buf, WHAT)?;
    let topic = Topic::parse(r.bytes()?).map_err(|_| corrupt(WHAT))?;
    let kind = EnvelopeKind::from_u8(r.u8()?).ok_or_else(|| corrupt(WHAT))?;
    let server_ts_ns = r.i64()?;
    let sender_hmac = match r.bytes()? {
        [] => None,
        hmac => Some(SenderHmac::parse(hmac).ok_or_else(|| corrupt(WHAT))?),
    };
    let data = r.bytes()?;
    let mut relay = RelayMeta::default();
    if !r.buf.is_empty() {
        let id = r.string()?;
        if !id.is_empty() {
            relay.message_id = Some(MessageId::parse(&id).map_err(|_| corrupt(WHAT))?);
        }
        relay.membership = match r.u8()? {
            0 => None,
            m => Some(MembershipChange::from_u8(m).ok_or_else(|| corrupt(WHAT))?),
        };
    }
    r.end()?;
    let envelope = StoredEnvelope {
        shard,
        sequence_id,
        topic,
        kind,
        server_ts_ns,
        sender_hmac,
        // 003 §3: the relay's mls_message; larger data stays here, out of windows.
        data: if data.len() <= MAX_INLINE_DATA { data.to_vec() } else { Vec::new() },
        relay,
    };
    Ok((envelope, data))
}

pub(super) fn encode_shard(s: &ShardRow) -> Vec<u8> {
    Writer::new().u64(s.boundary).u64(s.checkpoint).u64(s.last).finish()
}

pub(super) fn decode_shard(buf: &[u8]) -> Result<ShardRow, StoreError> {
    let mut r = Reader::new(buf, "shard")?;
    let row = ShardRow { boundary: r.u64()?, checkpoint: r.u64()?, last: r.u64()? };
    r.end()?;
    Ok(row)
}
