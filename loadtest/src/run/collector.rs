//! The receiver side of a run: parses and checks every webhook, APNs or Web
//! Push request the mocks get, decides the answer (the fault mix), and accounts
//! for every expected (envelope, subscription) pair without keeping the
//! requests.
//!
//! Per pair it keeps two bytes (attempts seen, 2xx answers given). A request
//! can arrive before the Publish RPC that stored its envelope has returned;
//! such arrivals wait in `pending` until the envelope is known.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use fanout_testkit::ScriptedResponse;
use fanout_testkit::mock::apns::{ApnsHook, ApnsHookRequest, ApnsReply};
use fanout_testkit::mock::webhook::{HookRequest, RequestHook, verify_gim_signature_now, verify_standard_webhooks};
use fanout_testkit::mock::webpush::{WebPushHook, WebPushHookRequest, WebPushReply};
use fanout_testkit::webpush::{Subscriber, decrypt};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::ids::RunIds;
use super::scenario::{Faults, Plan, ScenarioChannel};

/// What one request is about, read from its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub topic: u32,
    pub seq: u64,
    pub recipient: u32,
}

/// PUSH-259's body: the webhook's has `recipient_id`, APNs's does not (the
/// device token names the recipient).
#[derive(Deserialize)]
struct Body<'a> {
    topic: &'a str,
    sequence_id: &'a str,
    #[serde(default)]
    recipient_id: &'a str,
}

/// The secret of the relay channel's X-Gim-Signature in relay scenarios.
pub const RELAY_SECRET: &[u8] = b"fanout-loadtest-relay-secret-0123";

/// Recipient `id`'s endpoint at the mock push service `base`: the
/// subscription id in the path is the recipient id in hex.
pub fn webpush_endpoint(base: &str, id: &[u8]) -> String {
    format!("{base}/push/{}", hex::encode(id))
}

/// Spec 003 §2.3's body, the parts that name the delivery: the device by its
/// registration token (its recipient id in hex), the envelope by gid and seq.
#[derive(Deserialize)]
struct RelayBody {
    registration: RelayRegistration,
    payload: RelayPayload,
}

#[derive(Deserialize)]
struct RelayRegistration {
    token: String,
}

#[derive(Deserialize)]
struct RelayPayload {
    gid: String,
    seq: u64,
}

/// The fault a delivery gets, from its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Status(u16),
    Delay,
}

struct Envelope {
    /// Index of its first pair in `attempts`/`delivered`.
    offset: u64,
    topic: u32,
    seq: u64,
    published_at: Instant,
}

/// An arrival parked until its envelope is known: (recipient, when, answered 2xx).
type Pending = (u32, Instant, bool);

struct Inner {
    /// (topic, sequence id) → index in `envelopes`.
    by_key: HashMap<(u32, u64), u32>,
    envelopes: Vec<Envelope>,
    /// Per pair: attempts seen, and 2xx answers given (both saturating).
    attempts: Vec<u8>,
    delivered: Vec<u8>,
    /// Arrivals whose envelope is not known yet, with the answer they got.
    pending: HashMap<(u32, u64), Vec<Pending>>,
    distinct: u64,
    duplicates: u64,
    requests: u64,
    unexpected: u64,
    bad_signatures: u64,
    statuses: BTreeMap<u16, u64>,
    /// Publish-to-receiver latency of first deliveries, microseconds.
    latency_us: Histogram<u64>,
    /// First deliveries per second since `start`.
    per_second: Vec<u64>,
    /// Duplicates per second since `start`: which handoff repeated what.
    duplicates_per_second: Vec<u64>,
    start: Option<Instant>,
    last_delivery: Option<Instant>,
    /// Mixed scenarios: each first delivery's recipient and arrival, and
    /// each duplicate's recipient, so every figure can be split by channel.
    timeline: Option<Timeline>,
}

#[derive(Default)]
struct Timeline {
    first: Vec<(u32, Instant)>,
    duplicates: Vec<u32>,
}

/// One channel's share of a mixed scenario's deliveries.
#[derive(Debug, Clone, Default)]
pub struct ChannelTally {
    /// Pairs of the stored envelopes whose recipient is on the channel.
    pub expected: u64,
    pub delivered: u64,
    pub duplicates: u64,
    /// Each first delivery's arrival, earliest first.
    pub arrivals: Vec<Instant>,
}

/// Accounting for one phase (an engine run, or the ceiling).
pub struct Collector {
    plan: Arc<Plan>,
    ids: RunIds,
    faults: Faults,
    /// Relay scenarios: gid → topic index.
    gids: HashMap<String, u32>,
    /// Web Push scenarios: each recipient's subscription (its private key),
    /// derived from the ids on its first push.
    subscribers: Vec<OnceLock<Subscriber>>,
    inner: Mutex<Inner>,
}

/// Counters for the progress line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub distinct: u64,
    pub requests: u64,
    pub duplicates: u64,
    pub expected: u64,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    pub fn from_histogram_us(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            mean_ms: h.mean() / 1000.0,
        }
    }
}

/// The collector's final figures.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Pairs expected from the envelopes that were stored.
    pub expected: u64,
    /// Pairs answered 2xx at least once.
    pub delivered: u64,
    pub missing: u64,
    /// 2xx answers beyond the first for a pair.
    pub duplicates: u64,
    /// Requests received (every attempt, faulted or not).
    pub attempts: u64,
    /// Requests whose body or ids were not of this run's expected pairs
    /// (`unacknowledged` included).
    pub unexpected: u64,
    /// Of `unexpected`, the requests for an envelope no Publish answer
    /// named: with several nodes and a fault, the copies of envelopes whose
    /// publish had an unknown outcome and was resent.
    pub unacknowledged: u64,
    /// Requests with a wrong or missing webhook signature (answered 400).
    pub bad_signatures: u64,
    /// Answers sent, by status.
    pub statuses: BTreeMap<u16, u64>,
    /// First publish to last first-delivery, seconds.
    pub seconds: f64,
    pub deliveries_per_second: f64,
    pub latency: Percentiles,
    /// First deliveries in each second since the first publish.
    pub per_second: Vec<u64>,
    /// Duplicates in each second since the first publish.
    pub duplicates_per_second: Vec<u64>,
    /// A few missing pairs, "topic/sequence_id/recipient" (indices), for debugging.
    pub missing_examples: Vec<String>,
}

/// A latency histogram in microseconds, 1 µs to 1 hour, 3 significant
/// figures (values above an hour are clamped by `saturating_record`).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Collector {
    pub fn new(plan: Arc<Plan>, ids: RunIds, faults: Faults) -> Arc<Collector> {
        let gids = if plan.relay() {
            (0..plan.topics()).map(|t| (fanout_engine::channel::relay::gid(&ids.topic(t)[1..]), t)).collect()
        } else {
            HashMap::new()
        };
        let subscribers = match plan.channel {
            ScenarioChannel::WebPush => (0..plan.recipients).map(|_| OnceLock::new()).collect(),
            _ => Vec::new(),
        };
        let timeline = (plan.channel == ScenarioChannel::Mixed).then(Timeline::default);
        Arc::new(Collector {
            plan,
            ids,
            faults,
            gids,
            subscribers,
            inner: Mutex::new(Inner {
                by_key: HashMap::new(),
                envelopes: Vec::new(),
                attempts: Vec::new(),
                delivered: Vec::new(),
                pending: HashMap::new(),
                distinct: 0,
                duplicates: 0,
                requests: 0,
                unexpected: 0,
                bad_signatures: 0,
                statuses: BTreeMap::new(),
                latency_us: latency_histogram(),
                per_second: Vec::new(),
                duplicates_per_second: Vec::new(),
                start: None,
                last_delivery: None,
                timeline,
            }),
        })
    }

    /// The identity space this collector accounts for.
    pub fn ids(&self) -> RunIds {
        self.ids
    }

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The hook to install on the mock receivers.
    pub fn hook(self: &Arc<Self>) -> RequestHook {
        let me = self.clone();
        RequestHook::new(move |req| Some(me.on_request(req)))
    }

    /// Marks the first publish: time zero of the throughput figures.
    pub fn mark_start(&self, at: Instant) {
        lock(&self.inner).start.get_or_insert(at);
    }

    /// Parses, checks the signature, accounts, and answers one request.
    pub fn on_request(&self, req: &HookRequest<'_>) -> ScriptedResponse {
        let now = Instant::now();
        match self.parse(req) {
            Some((arrival, true)) => self.arrive(arrival, now),
            Some((_, false)) => self.refused(true, 400),
            None => self.refused(false, 400),
        }
    }

    /// The hook to install on the mock APNs of an apns scenario.
    pub fn apns_hook(self: &Arc<Self>) -> ApnsHook {
        let me = self.clone();
        ApnsHook::new(move |req| me.on_apns_request(req))
    }

    /// Accounts for one APNs request and answers it with the fault mix in
    /// APNs's words. A request the mock refused (provider token, collapse id,
    /// expiration) counts with the bad signatures: the run fails.
    pub fn on_apns_request(&self, req: &ApnsHookRequest<'_>) -> Option<ApnsReply> {
        if let Some(refusal) = req.refusal {
            self.refused(true, refusal.status);
            return None;
        }
        let answer = match self.parse_apns(req) {
            Some(arrival) => self.arrive(arrival, Instant::now()),
            None => self.refused(false, 400),
        };
        let reply = match answer.status {
            200 => ApnsReply::ok(),
            500 => ApnsReply::reason(500, "InternalServerError"),
            503 => ApnsReply::reason(503, "ServiceUnavailable"),
            400 => ApnsReply::reason(400, "BadDeviceToken"),
            status => ApnsReply::status(status),
        };
        Some(reply.with_delay(answer.delay))
    }

    /// The hook to install on the mock push service of a webpush scenario,
    /// answering `latency` later than the accounting says.
    pub fn webpush_hook(self: &Arc<Self>, latency: Duration) -> WebPushHook {
        let me = self.clone();
        WebPushHook::new(move |req| {
            let reply = me.on_webpush_request(req);
            let delay = reply.delay + latency;
            reply.with_delay(delay)
        })
    }

    /// Accounts for one push to the mock push service (RFC 8030): the
    /// recipient from the endpoint path (its id in hex), the envelope from
    /// the body decrypted with the recipient's key (RFC 8291). A VAPID token
    /// the mock refused (RFC 8292) or a body that does not decrypt counts
    /// with the bad signatures: the run fails.
    pub fn on_webpush_request(&self, req: &WebPushHookRequest<'_>) -> WebPushReply {
        let recipient = hex::decode(req.subscription).ok().and_then(|id| self.ids.recipient_index(&id));
        let Some(subscriber) = recipient.and_then(|r| self.webpush_subscriber(r)) else {
            return WebPushReply::status(self.refused(false, 404).status);
        };
        if req.vapid.is_err() {
            return WebPushReply::status(self.refused(true, 401).status);
        }
        let plaintext = match req.header("content-encoding") {
            Some("aes128gcm") => decrypt(subscriber, req.body).ok(),
            _ => None,
        };
        let Some(plaintext) = plaintext else {
            return WebPushReply::status(self.refused(true, 400).status);
        };
        let envelope = serde_json::from_slice::<Body<'_>>(&plaintext).ok().and_then(|b| self.envelope_of(&b));
        let answer = match (envelope, recipient) {
            (Some((topic, seq)), Some(recipient)) => self.arrive(Arrival { topic, seq, recipient }, Instant::now()),
            _ => self.refused(false, 400),
        };
        WebPushReply::status(answer.status).with_delay(answer.delay)
    }

    /// Recipient `index`'s subscription, derived once.
    fn webpush_subscriber(&self, index: u32) -> Option<&Subscriber> {
        let slot = self.subscribers.get(index as usize)?;
        Some(slot.get_or_init(|| self.ids.webpush_subscriber(index)))
    }

    /// Counts a request that is no expected delivery (`bad`: its credential
    /// or signature failed), answered `status`.
    fn refused(&self, bad: bool, status: u16) -> ScriptedResponse {
        let mut inner = lock(&self.inner);
        inner.requests += 1;
        if bad {
            inner.bad_signatures += 1;
        } else {
            inner.unexpected += 1;
        }
        *inner.statuses.entry(status).or_default() += 1;
        ScriptedResponse::status(status)
    }

    /// An APNs request (PUSH-259): the recipient from the device token (its
    /// id in hex), the envelope from the body's topic and sequence id.
    fn parse_apns(&self, req: &ApnsHookRequest<'_>) -> Option<Arrival> {
        self.apns_arrival(req.token, req.body)
    }

    /// The delivery a push to device `token` with `body` is for.
    fn apns_arrival(&self, token: &str, body: &[u8]) -> Option<Arrival> {
        let body: Body<'_> = serde_json::from_slice(body).ok()?;
        let (topic, seq) = self.envelope_of(&body)?;
        let recipient = self.ids.recipient_index(&hex::decode(token).ok()?)?;
        Some(Arrival { topic, seq, recipient })
    }

    /// A push Pushy's mock APNs accepted (`--apns-server pushy`): it
    /// verified the provider token, so only the delivery is checked here.
    /// The answer is already given (200): the scenario has no faults.
    pub fn apns_accepted(&self, token: &str, body: &[u8]) {
        match self.apns_arrival(token, body) {
            Some(arrival) => {
                self.arrive(arrival, Instant::now());
            }
            None => {
                self.refused(false, 200);
            }
        }
    }

    /// A push Pushy's mock APNs rejected, with its reason (e.g.
    /// `INVALID_PROVIDER_TOKEN`): counted with the bad signatures, so the run
    /// fails.
    pub fn apns_rejected(&self, reason: &str) {
        let status = match reason {
            r if r.contains("PROVIDER_TOKEN") || r == "FORBIDDEN" => 403,
            "INTERNAL_SERVER_ERROR" => 500,
            _ => 400,
        };
        self.refused(true, status);
    }

    /// The (topic index, sequence id) a PUSH-259 body names.
    fn envelope_of(&self, body: &Body<'_>) -> Option<(u32, u64)> {
        Some((self.ids.topic_index(&BASE64.decode(body.topic).ok()?)?, body.sequence_id.parse().ok()?))
    }

    /// The delivery a request is for, and whether its signature is valid.
    fn parse(&self, req: &HookRequest<'_>) -> Option<(Arrival, bool)> {
        if self.plan.relay() {
            return self.parse_relay(req);
        }
        let body: Body<'_> = serde_json::from_slice(req.body).ok()?;
        let (topic, seq) = self.envelope_of(&body)?;
        let recipient = self.ids.recipient_index(&hex::decode(body.recipient_id).ok()?)?;
        let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        let valid = match (header("webhook-id"), header("webhook-timestamp"), header("webhook-signature")) {
            (Some(id), Some(ts), Some(sig)) => {
                verify_standard_webhooks(&self.ids.signing_key(recipient), id, ts, req.body, sig)
            }
            _ => false,
        };
        Some((Arrival { topic, seq, recipient }, valid))
    }

    /// A relay webhook (spec 003 §2): the device from the token, the
    /// envelope from gid and seq, X-Gim-Signature under `RELAY_SECRET`.
    fn parse_relay(&self, req: &HookRequest<'_>) -> Option<(Arrival, bool)> {
        let body: RelayBody = serde_json::from_slice(req.body).ok()?;
        let topic = *self.gids.get(&body.payload.gid)?;
        let recipient = self.ids.recipient_index(&hex::decode(&body.registration.token).ok()?)?;
        let valid = req
            .headers
            .get("x-gim-signature")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|sig| verify_gim_signature_now(RELAY_SECRET, sig, req.body));
        Some((Arrival { topic, seq: body.payload.seq, recipient }, valid))
    }

    /// Accounts for one (validly signed) request and returns its answer.
    pub fn arrive(&self, a: Arrival, now: Instant) -> ScriptedResponse {
        let fault = self.fault(a);
        let mut inner = lock(&self.inner);
        inner.requests += 1;
        let answer = match inner.by_key.get(&(a.topic, a.seq)).copied() {
            Some(e) => {
                let env = &inner.envelopes[e as usize];
                let published_at = env.published_at;
                match self.plan.slot_of(env.topic, a.recipient) {
                    Some(slot) => {
                        let pair = (env.offset + u64::from(slot)) as usize;
                        let attempt = inner.attempts[pair];
                        inner.attempts[pair] = attempt.saturating_add(1);
                        let answer = self.answer(fault, u32::from(attempt));
                        if is_ok(&answer) {
                            inner.first_or_duplicate(pair, a.recipient, published_at, now);
                        }
                        answer
                    }
                    None => {
                        inner.unexpected += 1;
                        ScriptedResponse::status(400)
                    }
                }
            }
            None => {
                // Not published yet (or not of this run): park it. Before the
                // Publish RPC returned, this can only be a first attempt.
                let answer = self.answer(fault, 0);
                inner.pending.entry((a.topic, a.seq)).or_default().push((a.recipient, now, is_ok(&answer)));
                answer
            }
        };
        *inner.statuses.entry(answer.status).or_default() += 1;
        answer
    }

    /// Records a stored envelope (when its Publish RPC returned) and settles
    /// the requests that arrived for it before that.
    pub fn envelope_published(&self, topic: u32, seq: u64, published_at: Instant) {
        let mut inner = lock(&self.inner);
        let inner = &mut *inner;
        let offset = inner.attempts.len() as u64;
        let pairs = self.plan.subscribers[topic as usize] as usize;
        let index = inner.envelopes.len() as u32;
        inner.envelopes.push(Envelope { offset, topic, seq, published_at });
        inner.by_key.insert((topic, seq), index);
        inner.attempts.resize(inner.attempts.len() + pairs, 0);
        inner.delivered.resize(inner.delivered.len() + pairs, 0);
        for (recipient, at, ok) in inner.pending.remove(&(topic, seq)).unwrap_or_default() {
            match self.plan.slot_of(topic, recipient) {
                Some(slot) => {
                    let pair = (offset + u64::from(slot)) as usize;
                    inner.attempts[pair] = inner.attempts[pair].saturating_add(1);
                    if ok {
                        inner.first_or_duplicate(pair, recipient, published_at, at);
                    }
                }
                None => inner.unexpected += 1,
            }
        }
    }

    pub fn counts(&self) -> Counts {
        let inner = lock(&self.inner);
        Counts {
            distinct: inner.distinct,
            requests: inner.requests,
            duplicates: inner.duplicates,
            expected: inner.attempts.len() as u64,
        }
    }

    /// Waits until every expected pair arrived or `timeout` passed.
    pub async fn wait_complete(&self, expected: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.counts().distinct >= expected {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Mixed scenarios: the first deliveries so far to recipients on `channel`.
    pub fn delivered_on(&self, channel: ScenarioChannel) -> u64 {
        let inner = lock(&self.inner);
        let Some(timeline) = &inner.timeline else { return 0 };
        timeline.first.iter().filter(|(r, _)| self.plan.channel_of(*r) == channel).count() as u64
    }

    /// Mixed scenarios: expected, delivered and duplicate pairs of the
    /// recipients on `channel`, and when each first delivery arrived.
    pub fn tally(&self, channel: ScenarioChannel) -> ChannelTally {
        let inner = lock(&self.inner);
        let on = |r: u32| self.plan.channel_of(r) == channel;
        let expected = inner
            .envelopes
            .iter()
            .map(|env| {
                (0..self.plan.subscribers[env.topic as usize])
                    .filter(|s| on(self.plan.subscriber(env.topic, *s)))
                    .count() as u64
            })
            .sum();
        let Some(timeline) = &inner.timeline else { return ChannelTally { expected, ..ChannelTally::default() } };
        let mut arrivals: Vec<Instant> = timeline.first.iter().filter(|(r, _)| on(*r)).map(|(_, at)| *at).collect();
        arrivals.sort_unstable();
        ChannelTally {
            expected,
            delivered: arrivals.len() as u64,
            duplicates: timeline.duplicates.iter().filter(|r| on(**r)).count() as u64,
            arrivals,
        }
    }

    pub fn summary(&self) -> Summary {
        let inner = lock(&self.inner);
        let expected = inner.attempts.len() as u64;
        let seconds = match (inner.start, inner.last_delivery) {
            (Some(s), Some(l)) => l.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        };
        let pending: u64 = inner.pending.values().map(|v| v.len() as u64).sum();
        let mut missing_examples = Vec::new();
        let all_there = inner.distinct == expected;
        for env in inner.envelopes.iter().filter(|_| !all_there) {
            if missing_examples.len() >= 5 {
                break;
            }
            for slot in 0..self.plan.subscribers[env.topic as usize] {
                if inner.delivered[(env.offset + u64::from(slot)) as usize] == 0 && missing_examples.len() < 5 {
                    let recipient = self.plan.subscriber(env.topic, slot);
                    missing_examples.push(format!("topic {} / seq {} / recipient {recipient}", env.topic, env.seq));
                }
            }
        }
        Summary {
            expected,
            delivered: inner.distinct,
            missing: expected - inner.distinct,
            duplicates: inner.duplicates,
            attempts: inner.requests,
            unexpected: inner.unexpected + pending,
            unacknowledged: pending,
            bad_signatures: inner.bad_signatures,
            statuses: inner.statuses.clone(),
            seconds,
            deliveries_per_second: if seconds > 0.0 { inner.distinct as f64 / seconds } else { 0.0 },
            latency: Percentiles::from_histogram_us(&inner.latency_us),
            per_second: inner.per_second.clone(),
            duplicates_per_second: inner.duplicates_per_second.clone(),
            missing_examples,
        }
    }

    fn fault(&self, a: Arrival) -> Fault {
        if !self.faults.any() {
            return Fault::None;
        }
        let h = self.ids.delivery_hash(a.topic, a.seq, a.recipient);
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let f = &self.faults;
        let steps = [
            (f.status_503, Fault::Status(503)),
            (f.status_500, Fault::Status(500)),
            (f.status_404, Fault::Status(404)),
            (f.delay, Fault::Delay),
        ];
        let mut acc = 0.0;
        for (p, fault) in steps {
            acc += p;
            if u < acc {
                return fault;
            }
        }
        Fault::None
    }

    /// The answer to attempt number `attempt` (0 = first) of a delivery.
    fn answer(&self, fault: Fault, attempt: u32) -> ScriptedResponse {
        match fault {
            Fault::Status(code) if attempt < self.faults.failed_attempts() => ScriptedResponse::status(code),
            Fault::Delay if attempt == 0 => {
                ScriptedResponse::status(200).with_delay(Duration::from_millis(self.faults.delay_ms))
            }
            _ => ScriptedResponse::status(200),
        }
    }
}

fn is_ok(answer: &ScriptedResponse) -> bool {
    (200..300).contains(&answer.status)
}

/// Adds one to the second of `at` since `start`, when started.
fn count_second(per_second: &mut Vec<u64>, start: Option<Instant>, at: Instant) {
    let Some(start) = start else { return };
    let second = at.saturating_duration_since(start).as_secs() as usize;
    if per_second.len() <= second {
        per_second.resize(second + 1, 0);
    }
    per_second[second] += 1;
}

impl Inner {
    /// A 2xx answer for `pair`: its first delivery, or a duplicate.
    fn first_or_duplicate(&mut self, pair: usize, recipient: u32, published_at: Instant, at: Instant) {
        let seen = self.delivered[pair];
        self.delivered[pair] = seen.saturating_add(1);
        if seen > 0 {
            self.duplicates += 1;
            count_second(&mut self.duplicates_per_second, self.start, at);
            if let Some(timeline) = &mut self.timeline {
                timeline.duplicates.push(recipient);
            }
            return;
        }
        self.distinct += 1;
        if let Some(timeline) = &mut self.timeline {
            timeline.first.push((recipient, at));
        }
        // Arrivals before the Publish RPC returned count as zero latency.
        let us = at.saturating_duration_since(published_at).as_micros() as u64;
        self.latency_us.saturating_record(us);
        count_second(&mut self.per_second, self.start, at);
        if self.last_delivery.is_none_or(|l| at > l) {
            self.last_delivery = Some(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::scenario::Scenario;

    fn plan() -> Arc<Plan> {
        plan_on("http")
    }

    /// 5 recipients, 2 topics of 3 subscribers, one envelope each, on `channel`.
    fn plan_on(channel: &str) -> Arc<Plan> {
        let s = Scenario::parse(&format!(
            "name = \"t\"\nchannel = \"{channel}\"\nrecipients = 5\ntopics = [{{ count = 2, subscribers = 3 }}]\n\
             [envelopes]\nper_topic = 1\n"
        ))
        .unwrap();
        Arc::new(Plan::new(&s))
    }

    #[test]
    fn counts_missing_duplicates_and_pending() {
        let plan = plan();
        let ids = RunIds::from_seed(7);
        let c = Collector::new(plan.clone(), ids, Faults::default());
        let t0 = Instant::now();
        c.mark_start(t0);
        // Topic 0 → recipients 0,1,2; topic 1 → recipients 3,4,0.
        // A request for topic 1 / seq 9 arrives before its Publish returned.
        let early = Arrival { topic: 1, seq: 9, recipient: 4 };
        assert_eq!(c.arrive(early, t0).status, 200);
        c.envelope_published(0, 5, t0);
        c.envelope_published(1, 9, t0 + Duration::from_millis(1));
        let at = t0 + Duration::from_millis(10);
        for r in [0, 1, 1] {
            c.arrive(Arrival { topic: 0, seq: 5, recipient: r }, at);
        }
        c.arrive(Arrival { topic: 1, seq: 9, recipient: 3 }, at);
        // Not a subscriber of topic 0, and an unknown envelope.
        assert_eq!(c.arrive(Arrival { topic: 0, seq: 5, recipient: 4 }, at).status, 400);
        c.arrive(Arrival { topic: 0, seq: 77, recipient: 0 }, at);

        let s = c.summary();
        assert_eq!(s.expected, 6);
        assert_eq!(s.delivered, 4); // (0,5,0) (0,5,1) (1,9,4) (1,9,3)
        assert_eq!(s.missing, 2); // (0,5,2) and (1,9,0)
        assert_eq!(s.duplicates, 1);
        assert_eq!(s.attempts, 7);
        assert_eq!(s.unexpected, 2);
        assert_eq!(s.latency.count, 4);
        assert_eq!(s.per_second, vec![4]);
        assert_eq!(s.duplicates_per_second, vec![1]);
        assert_eq!(s.missing_examples.len(), 2);
        // The early arrival counts as zero latency, the others 9-10 ms.
        assert_eq!(s.latency.max_ms.round(), 10.0);
    }

    /// A mixed scenario splits every figure by the recipient's channel:
    /// even recipients are webhooks, odd ones APNs devices.
    #[test]
    fn mixed_scenarios_are_tallied_per_channel() {
        let s = Scenario::parse(
            "name = \"t\"\nchannel = \"mixed\"\nrecipients = 4\ntopics = [{ count = 1, subscribers = 4 }]\n\
             [envelopes]\nper_topic = 1\n[outage]\nkind = \"hang\"\nduration_seconds = 1\n",
        )
        .unwrap();
        let c = Collector::new(Arc::new(Plan::new(&s)), RunIds::from_seed(5), Faults::default());
        let t0 = Instant::now();
        c.mark_start(t0);
        c.envelope_published(0, 1, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        for (recipient, ms) in [(0, 10), (1, 30), (2, 20), (0, 40)] {
            c.arrive(Arrival { topic: 0, seq: 1, recipient }, at(ms));
        }
        let http = c.tally(ScenarioChannel::Http);
        assert_eq!((http.expected, http.delivered, http.duplicates), (2, 2, 1));
        assert_eq!(http.arrivals, vec![at(10), at(20)]);
        let apns = c.tally(ScenarioChannel::Apns);
        assert_eq!((apns.expected, apns.delivered, apns.duplicates), (2, 1, 0));
        assert_eq!((c.delivered_on(ScenarioChannel::Http), c.delivered_on(ScenarioChannel::Apns)), (2, 1));
        assert_eq!(c.summary().missing, 1);
    }

    /// `--apns-server pushy`: Pushy's accepted lines count as deliveries,
    /// a push for no expected delivery as unexpected, a rejection as a bad
    /// signature (the run fails).
    #[test]
    fn pushy_lines_are_accounted() {
        let plan = plan_on("apns");
        let ids = RunIds::from_seed(11);
        let c = Collector::new(plan.clone(), ids, Faults::default());
        c.envelope_published(0, 1, Instant::now());
        let body = |topic: u32, seq: u64| crate::run::ceiling::apns_body(ids, topic, seq).1;
        let token = |r: u32| hex::encode(ids.recipient_id(r));
        for r in 0..3 {
            c.apns_accepted(&token(r), body(0, 1).as_bytes());
        }
        c.apns_accepted(&token(0), body(0, 1).as_bytes()); // a duplicate
        c.apns_accepted(&token(4), body(0, 1).as_bytes()); // not a subscriber of topic 0
        c.apns_accepted("00", body(0, 1).as_bytes()); // not a recipient of this run
        c.apns_rejected("INVALID_PROVIDER_TOKEN");
        c.apns_rejected("BAD_COLLAPSE_ID");
        let s = c.summary();
        assert_eq!((s.expected, s.delivered, s.missing, s.duplicates), (3, 3, 0, 1));
        assert_eq!((s.unexpected, s.bad_signatures, s.attempts), (2, 2, 8));
        assert_eq!((s.statuses.get(&403), s.statuses.get(&400)), (Some(&1), Some(&2)));
    }

    #[test]
    fn faults_fail_only_the_first_attempts() {
        let plan = plan();
        let faults = Faults { status_503: 0.5, status_404: 0.25, delay: 0.25, delay_ms: 50, ..Faults::default() };
        let c = Collector::new(plan.clone(), RunIds::from_seed(3), faults);
        c.envelope_published(0, 1, Instant::now());
        let mut first = Vec::new();
        for r in 0..3 {
            let a = Arrival { topic: 0, seq: 1, recipient: r };
            let answer = c.arrive(a, Instant::now());
            first.push(answer.status);
            if answer.status != 200 {
                assert_eq!(c.arrive(a, Instant::now()).status, 200, "the retry is accepted");
            }
        }
        let s = c.summary();
        assert_eq!(s.missing, 0);
        assert_eq!(s.duplicates, 0);
        assert_eq!(s.attempts, 3 + first.iter().filter(|s| **s != 200).count() as u64);
        // Every answer is a 200 or one of the scripted faults.
        assert!(first.iter().all(|s| [200, 503, 404].contains(s)), "{first:?}");
    }

    #[test]
    fn percentiles_from_a_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for ms in 1..=1000u64 {
            h.record(ms * 1000).unwrap();
        }
        let p = Percentiles::from_histogram_us(&h);
        assert_eq!(p.count, 1000);
        assert!((p.p50_ms - 500.0).abs() < 1.0, "{p:?}");
        assert!((p.p90_ms - 900.0).abs() < 1.0, "{p:?}");
        assert!((p.p99_ms - 990.0).abs() < 1.0, "{p:?}");
        assert!((p.p999_ms - 999.0).abs() < 1.0, "{p:?}");
        assert!((p.max_ms - 1000.0).abs() < 1.0, "{p:?}");
        assert_eq!(Percentiles::from_histogram_us(&Histogram::<u64>::new(3).unwrap()).count, 0);
    }

    #[test]
    fn parses_signed_requests_and_refuses_bad_signatures() {
        use fanout_testkit::mock::webhook::standard_webhooks_signature;
        let plan = plan();
        let ids = RunIds::from_seed(11);
        let c = Collector::new(plan, ids, Faults::default());
        c.envelope_published(0, 42, Instant::now());
        let body = format!(
            r#"{{"topic":"{}","sequence_id":"42","recipient_id":"{}"}}"#,
            BASE64.encode(ids.topic(0)),
            hex::encode(ids.recipient_id(1))
        );
        let request = |key: &[u8]| {
            let mut headers = http::HeaderMap::new();
            headers.insert("webhook-id", "msg_1".parse().unwrap());
            headers.insert("webhook-timestamp", "1700000000".parse().unwrap());
            let sig = standard_webhooks_signature(key, "msg_1", "1700000000", body.as_bytes());
            headers.insert("webhook-signature", sig.parse().unwrap());
            headers
        };
        let good = request(&ids.signing_key(1));
        let bad = request(&ids.signing_key(2));
        let hook = |h: &http::HeaderMap| {
            c.on_request(&HookRequest { path: "/hook", headers: h, body: body.as_bytes() }).status
        };
        assert_eq!(hook(&bad), 400);
        assert_eq!(hook(&good), 200);
        let junk = HookRequest { path: "/hook", headers: &good, body: b"{}" };
        assert_eq!(c.on_request(&junk).status, 400);
        let s = c.summary();
        assert_eq!((s.delivered, s.bad_signatures, s.unexpected, s.attempts), (1, 1, 1, 3));
    }

    #[test]
    fn decrypts_web_pushes_and_refuses_bad_tokens_and_bodies() {
        use fanout_engine::channel::webpush::encrypt;
        use fanout_engine::domain::WebPushKeys;
        use fanout_testkit::webpush::Vapid;
        let s = Scenario::parse(
            "name = \"t\"\nchannel = \"webpush\"\nrecipients = 5\ntopics = [{ count = 2, subscribers = 3 }]\n\
             [envelopes]\nper_topic = 1\n",
        )
        .unwrap();
        let ids = RunIds::from_seed(13);
        let c = Collector::new(Arc::new(Plan::new(&s)), ids, Faults::default());
        c.envelope_published(0, 42, Instant::now());
        let subscriber = ids.webpush_subscriber(1);
        let keys = WebPushKeys::parse(&subscriber.p256dh(), subscriber.auth()).unwrap();
        let wake_up = format!(r#"{{"topic":"{}","sequence_id":"42"}}"#, BASE64.encode(ids.topic(0)));
        let body = encrypt(wake_up.as_bytes(), &keys).unwrap();
        let headers = vec![("content-encoding".to_owned(), "aes128gcm".to_owned())];
        let good: Result<Vapid, String> =
            Ok(Vapid { aud: "https://127.0.0.1".into(), exp: u64::MAX, sub: None, key: "k".into() });
        let refused: Result<Vapid, String> = Err("the JWT signature does not verify with k".into());
        let id = hex::encode(ids.recipient_id(1));
        let other = hex::encode(ids.recipient_id(2));
        let push = |subscription: &str, body: &[u8], vapid: &Result<Vapid, String>| {
            c.on_webpush_request(&WebPushHookRequest { subscription, headers: &headers, body, vapid }).status
        };
        assert_eq!(push(&id, &body, &refused), 401, "a bad token");
        assert_eq!(push(&other, &body, &good), 400, "another recipient's key does not decrypt it");
        assert_eq!(push(&id, b"not encrypted", &good), 400);
        assert_eq!(push("00ff", &body, &good), 404, "no such subscription");
        assert_eq!(push(&id, &body, &good), 200, "decrypted and accounted");
        let s = c.summary();
        assert_eq!((s.delivered, s.bad_signatures, s.unexpected, s.attempts), (1, 3, 1, 5));
    }
}
