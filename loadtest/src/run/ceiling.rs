//! The ceiling: a bare HTTP/2 client sending the run's webhook (or relay,
//! APNs or Web Push) requests straight to the same kind of mock receiver, with no engine
//! in between. Same client stack as the engine (`transport::http2`'s client
//! on h2 over hyper-rustls, h2 by ALPN), same signed body and headers, fixed
//! concurrency. Requests per second here is what this machine can do for
//! this work; the engine's deliveries per second is compared against it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use fanout_testkit::TestPki;
use fanout_testkit::mock::webhook::standard_webhooks_signature;

use fanout_engine::channel::PushLifetime;
use fanout_engine::channel::collapse::fit_collapse_id;
use fanout_engine::channel::webpush::Vapid;
use fanout_engine::domain::WebPushKeys;
use fanout_engine::transport::http2::Http2Client;
use fanout_engine::transport::pool;
use fanout_testkit::wire::WireCounts;
use http::HeaderValue;
use http_body_util::BodyExt as _;
use serde::Serialize;

use super::collector::{Collector, Percentiles, RELAY_SECRET, latency_histogram, webpush_endpoint};
use super::engine_process::{APNS_BUNDLE_ID, WEBPUSH_SUBJECT, own_cpu_seconds};
use super::ids::RunIds;
use super::progress::Progress;
use super::scenario::{Plan, ScenarioChannel};

/// The engine's bound on one attempt; the ceiling uses the same.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default, Serialize)]
pub struct CeilingResult {
    pub requests: u64,
    pub concurrency: usize,
    /// Requests answered 2xx.
    pub ok: u64,
    /// Non-2xx answers, timeouts and connection errors.
    pub failed: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    /// Request round trips as the client saw them.
    pub latency: Percentiles,
    /// What the mock read on the wire (apns scenarios).
    pub wire: Option<WireCounts>,
    /// The harness's CPU time over the requests: the bare client, its
    /// signing and the receivers answering (h2load's `harness_cpu_seconds`
    /// is the receivers' share for as many requests).
    pub cpu_seconds: Option<f64>,
}

/// Where the ceiling sends: the mocks' URLs, for an apns scenario the
/// provider token (`bearer <jwt>`) the mock verifies, for a webpush scenario
/// the run's VAPID key and every recipient's subscription keys.
pub struct Targets {
    pub urls: Vec<String>,
    pub apns_authorization: Option<HeaderValue>,
    pub webpush: Option<WebPushSender>,
}

/// The engine's side of Web Push for the ceiling: its VAPID signer (tokens
/// cached per origin, as in the engine) and the keys each recipient
/// registered, derived before the clock starts (the engine has them stored).
pub struct WebPushSender {
    pub vapid: Vapid,
    pub keys: Vec<WebPushKeys>,
}

impl WebPushSender {
    /// The run's VAPID key (PEM) and the keys of `plan`'s recipients.
    pub fn new(vapid_pem: &[u8], plan: &Plan, ids: RunIds) -> anyhow::Result<WebPushSender> {
        let vapid = Vapid::from_pem(vapid_pem, WEBPUSH_SUBJECT.into())?;
        let keys = (0..plan.recipients)
            .map(|r| {
                let subscriber = ids.webpush_subscriber(r);
                WebPushKeys::parse(&subscriber.p256dh(), subscriber.auth()).map_err(|e| anyhow::anyhow!("{e:?}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(WebPushSender { vapid, keys })
    }
}

/// The engine's client, built by the engine's own constructor, trusting the
/// test CA: the HTTP/2 client the engine's pools send through to a host
/// that speaks HTTP/2 (`transport::http2`); every receiver of the harness does. (The mocks listen
/// on 127.0.0.1, so it resolves through the system resolver rather than the
/// webhook safety check, which would refuse loopback.)
pub fn client(pki: &TestPki) -> Arc<Http2Client> {
    let mut tls = (*pki.client_config()).clone();
    tls.alpn_protocols.clear(); // hyper-rustls sets ALPN itself
    Arc::new(pool::http2_client(
        tls,
        Duration::from_secs(600),
        pool::Dialer::direct(pool::Resolver::system()),
        None,
        false,
    ))
}

/// The request for delivery `index` of the plan, with the body and headers
/// the engine would send.
pub(super) fn request(plan: &Plan, ids: RunIds, targets: &Targets, index: u64) -> http::Request<Bytes> {
    let (envelope, slot) = plan.delivery_at(index);
    let topic = plan.topic_of_envelope(envelope);
    let recipient = plan.subscriber(topic, slot);
    let urls = &targets.urls;
    match (plan.channel, &targets.apns_authorization, &targets.webpush) {
        (ScenarioChannel::Relay, _, _) => return relay_request(ids, urls, topic, envelope + 1, recipient),
        (ScenarioChannel::Apns, Some(authorization), _) => {
            return apns_request(ids, &urls[0], authorization, topic, envelope + 1, recipient);
        }
        (ScenarioChannel::WebPush, _, Some(sender)) => {
            return webpush_request(ids, &urls[0], sender, topic, envelope + 1, recipient);
        }
        _ => {}
    }
    // Synthetic sequence ids: envelope e is sequence e + 1 (see `run`).
    let body = format!(
        r#"{{"topic":"{}","sequence_id":"{}","recipient_id":"{}"}}"#,
        BASE64.encode(ids.topic(topic)),
        envelope + 1,
        hex::encode(ids.recipient_id(recipient))
    );
    let id = format!("msg_ceiling_{index}");
    let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_string();
    let signature = standard_webhooks_signature(&ids.signing_key(recipient), &id, &timestamp, body.as_bytes());
    http::Request::post(&urls[recipient as usize % urls.len()])
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp)
        .header("webhook-signature", signature)
        .body(Bytes::from(body))
        .expect("valid request")
}

/// The APNs request for the same delivery (spec 000 section 7, PUSH-259):
/// the engine's headers in its order, its collapse id and a day's
/// `apns-expiration` (the default), under the one provider token.
fn apns_request(
    ids: RunIds,
    base: &str,
    authorization: &HeaderValue,
    topic: u32,
    seq: u64,
    recipient: u32,
) -> http::Request<Bytes> {
    let (collapse_id, body) = apns_body(ids, topic, seq);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    http::Request::post(format!("{base}/3/device/{}", hex::encode(ids.recipient_id(recipient))))
        .header(http::header::AUTHORIZATION, authorization.clone())
        .header("apns-topic", APNS_BUNDLE_ID)
        .header("apns-push-type", "background")
        .header("apns-priority", "5")
        .header("apns-collapse-id", collapse_id)
        .header("apns-expiration", PushLifetime::DEFAULT.expires_at(now))
        .body(Bytes::from(body))
        .expect("valid request")
}

/// The `apns-collapse-id` and body the engine sends for envelope `seq` of
/// topic `topic` (PUSH-259, `channel::apns::request::apns_body`): the
/// topic in base64, fitted to APNs's 64 bytes, and the wake-up body.
pub(super) fn apns_body(ids: RunIds, topic: u32, seq: u64) -> (String, String) {
    let topic = BASE64.encode(ids.topic(topic));
    let body = format!(r#"{{"aps":{{"content-available":1}},"topic":"{topic}","sequence_id":"{seq}"}}"#);
    (fit_collapse_id(&topic).into_owned(), body)
}

/// The Web Push request for the same delivery, made by the engine's code
/// (RFC 8030/8291/8292): the wake-up of the stored envelope, encrypted for
/// the recipient's keys with a fresh sender key, the VAPID token for the
/// push service's origin, the default TTL and `normal` urgency.
fn webpush_request(
    ids: RunIds,
    base: &str,
    sender: &WebPushSender,
    topic: u32,
    seq: u64,
    recipient: u32,
) -> http::Request<Bytes> {
    use fanout_engine::channel::webpush::{PushHeaders, Urgency, encrypt, origin, request::request, wake_up};
    use fanout_engine::domain::{EnvelopeKind, ShardId, StoredEnvelope, Topic};
    let envelope = StoredEnvelope {
        shard: ShardId::FIRST,
        sequence_id: seq,
        topic: Topic::parse(&ids.topic(topic)).expect("the run's topics are group topics"),
        kind: EnvelopeKind::Application,
        server_ts_ns: 0,
        sender_hmac: None,
        data: Vec::new(),
        relay: Default::default(),
    };
    let endpoint: http::Uri =
        webpush_endpoint(base, &ids.recipient_id(recipient)).parse().expect("the mock's endpoint is a URI");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let audience = origin(endpoint.host().unwrap_or_default(), endpoint.port_u16().unwrap_or(443));
    let authorization = sender.vapid.authorization(&audience, now).expect("the run's VAPID key signs");
    let body = encrypt(wake_up(&envelope).as_bytes(), &sender.keys[recipient as usize]).expect("a wake-up fits");
    let headers =
        PushHeaders { ttl: u64::from(PushLifetime::DEFAULT.seconds()), urgency: Urgency::Normal, topic: None };
    request(&endpoint, authorization, &headers, body).expect("valid request")
}

/// The relay channel's request for the same delivery (spec 003 §2): the
/// body the engine sends, signed with X-Gim-Signature.
fn relay_request(ids: RunIds, urls: &[String], topic: u32, seq: u64, recipient: u32) -> http::Request<Bytes> {
    use fanout_engine::channel::relay::{HEADER_DELIVERY, HEADER_SIGNATURE, gid, stand_in_message_id};
    let identifier = &ids.topic(topic)[1..];
    let message_id = stand_in_message_id(identifier, seq);
    let delivery_id = format!("{:032x}", rand::random::<u128>());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let body = serde_json::json!({
        "v": 1, "hub_id": "fanout", "delivery_id": delivery_id, "sent_at": now.as_millis() as i64,
        "registration": {"provider": "apns", "token": hex::encode(ids.recipient_id(recipient))},
        "priority": "high", "collapse_id": message_id, "ttl": 86400,
        "payload": {"v": 1, "type": "message", "gid": gid(identifier), "seq": seq, "message_id": message_id,
            "collapse_id": message_id, "mls_message": BASE64.encode(b"loadtest ciphertext")}
    })
    .to_string();
    // Spec 003 §2.2, with the ingress's own signer (the engine's hub side signs the same way).
    let signature =
        fanout_engine::relay_ingress::signature::header_value(RELAY_SECRET, now.as_secs() as i64, body.as_bytes());
    http::Request::post(&urls[0])
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(HEADER_SIGNATURE, signature)
        .header(HEADER_DELIVERY, delivery_id)
        .body(Bytes::from(body))
        .expect("valid request")
}

/// Sends the first `requests` deliveries of the plan with `concurrency`
/// requests in flight. `collector` (fault-free) must be the hook of the
/// mocks behind `targets`; this registers the synthetic envelopes in it.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    pki: &TestPki,
    plan: &Arc<Plan>,
    ids: RunIds,
    targets: Targets,
    collector: &Arc<Collector>,
    requests: u64,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<CeilingResult> {
    let envelopes = if requests == 0 { 0 } else { plan.delivery_at(requests - 1).0 + 1 };
    let now = Instant::now();
    for e in 0..envelopes {
        collector.envelope_published(plan.topic_of_envelope(e), e + 1, now);
    }
    progress.phase("ceiling", requests);
    let client = client(pki);
    let next = Arc::new(AtomicU64::new(0));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let latency = Arc::new(std::sync::Mutex::new(latency_histogram()));
    let targets = Arc::new(targets);
    let cpu_before = own_cpu_seconds();
    let started = Instant::now();
    collector.mark_start(started);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, plan, targets, next) = (client.clone(), plan.clone(), targets.clone(), next.clone());
        let (ok, failed, latency, progress) = (ok.clone(), failed.clone(), latency.clone(), progress.clone());
        workers.spawn(async move {
            let mut local = latency_histogram();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= requests {
                    break;
                }
                let sent = Instant::now();
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
                    let response = client.request(request(&plan, ids, &targets, index)).await.ok()?;
                    let status = response.status();
                    // Drain the body so the stream is released, as the engine does.
                    let _ = response.into_body().collect().await;
                    Some(status)
                })
                .await;
                local.saturating_record(sent.elapsed().as_micros() as u64);
                match answer {
                    Ok(Some(status)) if status.is_success() => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                progress.add(1);
            }
            let _ = latency.lock().map(|mut h| h.add(&local));
        });
    }
    while workers.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    let latency = Percentiles::from_histogram_us(&latency.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(CeilingResult {
        requests,
        concurrency,
        ok,
        failed,
        seconds,
        requests_per_second: ok as f64 / seconds.max(1e-9),
        latency,
        wire: None,
        cpu_seconds: own_cpu_seconds().zip(cpu_before).map(|(after, before)| after - before),
    })
}
