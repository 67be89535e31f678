//! Scenario files (TOML, in `loadtest/scenarios/`) and the plan derived from
//! them: which recipient subscribes to which topic, and which topic each
//! envelope is published to.
//!
//! Subscriptions are laid out round-robin: the subscribers of topic `t` are
//! the recipients `(base(t) + slot) mod recipients` for `slot < subscribers(t)`,
//! where `base(t)` sums the subscriber counts of the topics before `t`. So a
//! topic never has the same recipient twice, and every recipient holds
//! `floor` or `ceil` of (all subscriptions / recipients) topics.
//! Envelope `e` goes to topic `e mod topics`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// The engine's attempt bound (section 7): receiver delays must stay below it.
const ATTEMPT_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// Which channel the recipients register on: `http` (spec 000's signed
    /// webhooks, the default), `relay` (spec 003: one push server, the
    /// mock, receives every device's push signed with X-Gim-Signature) or
    /// `apns` (spec 000's APNs channel: the mock APNs verifies every provider
    /// token and reports bytes per request) or `webpush` (RFC 8030: the mock
    /// push service checks every VAPID token and the receiver decrypts every
    /// body with the recipient's subscription key), or `mixed` (even
    /// recipients register a webhook, odd ones an APNs device: both channels
    /// on the same topics; with an `[outage]`).
    #[serde(default)]
    pub channel: ScenarioChannel,
    #[serde(default)]
    pub description: String,
    /// Webhook recipients registered for the run.
    pub recipients: u32,
    /// Groups of topics with their subscriber counts.
    pub topics: Vec<TopicGroup>,
    pub envelopes: Envelopes,
    #[serde(default)]
    pub faults: Faults,
    /// Mixed scenarios: the mock APNs's outage, and the run without it
    /// first (see `run::outage`).
    #[serde(default)]
    pub outage: Option<OutageSettings>,
    #[serde(default)]
    pub mock: MockSettings,
    #[serde(default)]
    pub setup: Setup,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub ceiling: CeilingSettings,
    /// Duplicate deliveries ÷ expected above this fail the run (default 0.01).
    #[serde(default = "default_max_duplicate_ratio")]
    pub max_duplicate_ratio: f64,
    /// The engine's peak RSS (VmHWM) above this many MiB fails the run: a
    /// memory ceiling, which `--max-rss-mib` overrides. None: not checked.
    #[serde(default)]
    pub max_peak_rss_mib: Option<f64>,
    /// Merged into the engine's `[engine]` table, e.g. `delivery.workers = 4`
    /// (see `fanout.example.toml` for the keys).
    #[serde(default)]
    pub engine: toml::Table,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScenarioChannel {
    #[default]
    Http,
    Relay,
    Apns,
    WebPush,
    Mixed,
}

/// The outage of a mixed scenario's failing channel (APNs): the harness runs
/// the scenario without it, then with it, and compares each channel's pace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutageSettings {
    /// `hang`, `refuse`, `tls-stall`, `slow` or `503` (`fanout_testkit::OutageKind`).
    pub kind: String,
    /// Seconds after the first Publish RPC (0: on before publishing starts).
    #[serde(default)]
    pub start_seconds: f64,
    /// How long the mock APNs fails before it is healthy again.
    pub duration_seconds: f64,
    /// `slow`: how late every answer comes, in milliseconds.
    #[serde(default = "default_slow_ms")]
    pub slow_ms: u64,
    /// The healthy channel's pace during the outage ÷ its pace without it
    /// below this fails the run.
    #[serde(default = "default_min_pace_ratio")]
    pub min_pace_ratio: f64,
}

fn default_slow_ms() -> u64 {
    3000
}

fn default_min_pace_ratio() -> f64 {
    0.9
}

impl OutageSettings {
    /// The kind, `slow` with `slow_ms`.
    pub fn kind(&self) -> anyhow::Result<fanout_testkit::OutageKind> {
        use fanout_testkit::OutageKind;
        match self.kind.parse::<OutageKind>().map_err(anyhow::Error::msg)? {
            OutageKind::Slow(_) => Ok(OutageKind::Slow(Duration::from_millis(self.slow_ms))),
            other => Ok(other),
        }
    }

    pub fn start(&self) -> Duration {
        Duration::from_secs_f64(self.start_seconds)
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_seconds)
    }
}

fn default_max_duplicate_ratio() -> f64 {
    0.01
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicGroup {
    /// Number of topics in the group.
    pub count: u32,
    /// Subscribers of each topic (at most `recipients`).
    pub subscribers: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelopes {
    /// Burst: this many envelopes per topic, published as fast as the engine takes them.
    pub per_topic: Option<u32>,
    /// Steady: envelopes per second, round-robin over the topics ...
    pub rate_per_second: Option<f64>,
    /// ... for this long.
    pub duration_seconds: Option<f64>,
    /// Envelopes per Publish RPC.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Publish RPCs in flight at once.
    #[serde(default = "default_publish_concurrency")]
    pub concurrency: usize,
}

/// The receiver's fault mix. Each fraction is of deliveries (envelope,
/// subscription pairs), picked by a hash of the delivery. A faulted delivery
/// gets the fault on its first `failed_attempts` attempts and a 200 after, so
/// with `failed_attempts < max_attempts` every delivery must still arrive:
/// 500, 503 and 404 are retried under the HTTPS outcome table. `delay`
/// answers the first attempt with 200 after `delay_ms` (a slow receiver).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    pub status_503: f64,
    pub status_500: f64,
    pub status_404: f64,
    pub delay: f64,
    pub delay_ms: u64,
    /// Attempts that fail before the receiver accepts (default 1).
    pub failed_attempts: Option<u32>,
}

impl Faults {
    pub fn failed_attempts(&self) -> u32 {
        self.failed_attempts.unwrap_or(1)
    }

    pub fn any(&self) -> bool {
        self.status_503 + self.status_500 + self.status_404 + self.delay > 0.0
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockSettings {
    /// Mock receivers (each its own port, so the engine opens one connection to each).
    pub receivers: usize,
    /// Delay before every answer.
    pub latency_ms: u64,
}

impl Default for MockSettings {
    fn default() -> Self {
        MockSettings { receivers: 1, latency_ms: 0 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Setup {
    /// Recipients registered concurrently.
    pub concurrency: usize,
    /// Subscriptions per UpdateSubscriptions request.
    pub subscriptions_per_request: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup { concurrency: 32, subscriptions_per_request: 1000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Bound on registering recipients and subscriptions.
    pub setup_seconds: u64,
    /// Bound on publishing (beyond a steady run's own duration).
    pub publish_seconds: u64,
    /// After the last publish: how long to wait for missing deliveries.
    pub drain_seconds: u64,
    /// After everything arrived: how long to keep counting late duplicates.
    pub settle_ms: u64,
    /// Engine start (until /readyz answers 200).
    pub engine_start_seconds: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            setup_seconds: 3600,
            publish_seconds: 600,
            drain_seconds: 120,
            settle_ms: 1000,
            engine_start_seconds: 60,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CeilingSettings {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Cap on the number of requests (default: as many as the run's deliveries).
    pub max_requests: Option<u64>,
}

impl Default for CeilingSettings {
    fn default() -> Self {
        CeilingSettings { concurrency: 256, max_requests: None }
    }
}

fn default_batch_size() -> usize {
    100
}

fn default_publish_concurrency() -> usize {
    4
}

impl Scenario {
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Scenario::parse(&text).with_context(|| format!("scenario {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Scenario> {
        let scenario: Scenario = toml::from_str(text)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// An engine key from the `[engine]` overrides, e.g. `("max_attempts", 3)`.
    fn engine_int(&self, key: &str, default: i64) -> i64 {
        self.engine.get(key).and_then(toml::Value::as_integer).unwrap_or(default)
    }

    pub fn max_attempts(&self) -> u32 {
        self.engine_int("max_attempts", 3).clamp(1, 1000) as u32
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.recipients == 0 {
            bail!("recipients must be greater than zero");
        }
        if self.topics.is_empty() || self.topics.iter().all(|g| g.count == 0) {
            bail!("at least one topic is needed");
        }
        for g in &self.topics {
            if g.subscribers == 0 || g.subscribers > self.recipients {
                bail!("a topic's subscribers must be between 1 and recipients ({})", self.recipients);
            }
        }
        let e = &self.envelopes;
        match (e.per_topic, e.rate_per_second, e.duration_seconds) {
            (Some(n), None, None) if n > 0 => {}
            (None, Some(rate), Some(secs)) if rate > 0.0 && secs > 0.0 => {}
            _ => bail!("envelopes: set either per_topic, or rate_per_second and duration_seconds"),
        }
        if e.batch_size == 0 || e.batch_size > 10_000 || e.concurrency == 0 {
            bail!("envelopes: batch_size must be 1..=10000 and concurrency at least 1");
        }
        let f = &self.faults;
        let fractions = [f.status_503, f.status_500, f.status_404, f.delay];
        if fractions.iter().any(|p| !(0.0..=1.0).contains(p)) || fractions.iter().sum::<f64>() > 1.0 + 1e-9 {
            bail!("faults: each fraction must be in 0..=1 and their sum at most 1");
        }
        if f.failed_attempts() + 1 > self.max_attempts() {
            bail!(
                "faults.failed_attempts ({}) must be below the engine's max_attempts ({}), or deliveries are legitimately dropped",
                f.failed_attempts(),
                self.max_attempts()
            );
        }
        if f.delay > 0.0 && (f.delay_ms == 0 || f.delay_ms >= ATTEMPT_TIMEOUT_MS / 2) {
            bail!(
                "faults.delay_ms must be between 1 and {} (well below the engine's attempt timeout)",
                ATTEMPT_TIMEOUT_MS / 2
            );
        }
        if self.mock.receivers == 0 || self.mock.receivers > 64 {
            bail!("mock.receivers must be 1..=64");
        }
        if self.setup.concurrency == 0 || self.setup.subscriptions_per_request == 0 {
            bail!("setup: concurrency and subscriptions_per_request must be at least 1");
        }
        if self.ceiling.concurrency == 0 {
            bail!("ceiling.concurrency must be at least 1");
        }
        let plan = Plan::new(self);
        match (&self.outage, self.channel) {
            (Some(outage), ScenarioChannel::Mixed) => {
                outage.kind()?;
                let seconds = [outage.start_seconds, outage.duration_seconds];
                if seconds.iter().any(|s| !s.is_finite() || *s < 0.0 || *s > 86_400.0) || outage.duration_seconds == 0.0
                {
                    bail!("outage: start_seconds must be 0 or more and duration_seconds more than 0 (at most a day)");
                }
                if !(0.0..=1.0).contains(&outage.min_pace_ratio) {
                    bail!("outage.min_pace_ratio must be in 0..=1");
                }
                if f.any() {
                    bail!("a mixed scenario has no receiver faults: its fault is the outage");
                }
                if self.recipients < 2 {
                    bail!("a mixed scenario needs at least 2 recipients (even ones webhooks, odd ones APNs)");
                }
            }
            (None, ScenarioChannel::Mixed) => bail!("a mixed scenario needs an [outage] table"),
            (Some(_), _) => bail!("[outage] is for mixed scenarios (channel = \"mixed\")"),
            (None, _) => {}
        }
        if self.channel == ScenarioChannel::Relay {
            // The relay coalesces a device's pending pushes (spec 003 §4), so
            // only a plan where each device gets one push accounts exactly:
            // the run measures the push path; coalescing has its e2e tests.
            if self.envelopes.per_topic != Some(1) || plan.max_subscriptions_per_recipient() > 1 {
                bail!("a relay scenario needs envelopes.per_topic = 1 and each recipient in at most one topic");
            }
            if self.mock.receivers != 1 {
                bail!("a relay scenario has one push server: mock.receivers must be 1");
            }
        }
        if self.channel == ScenarioChannel::Apns {
            if self.mock.receivers != 1 {
                bail!("an apns scenario has one APNs host: mock.receivers must be 1");
            }
            // APNs's 404 (BadPath) is rejected, not retried: it would lose deliveries.
            if f.status_404 > 0.0 {
                bail!("faults.status_404 does not apply to apns: APNs answers 503 or 500 for transient faults");
            }
        }
        if self.channel == ScenarioChannel::WebPush {
            if self.mock.receivers != 1 {
                bail!("a webpush scenario has one push service: mock.receivers must be 1");
            }
            // 404 means the subscription is gone (terminal): it would lose deliveries.
            if f.status_404 > 0.0 {
                bail!(
                    "faults.status_404 does not apply to webpush: a push service answers 404 for an expired subscription"
                );
            }
        }
        let max_topics = self.engine_int("max_push_topics", 100_000) as u64;
        if plan.max_subscriptions_per_recipient() > max_topics {
            bail!(
                "each recipient would hold up to {} topics, above the engine's max_push_topics ({max_topics}): add recipients",
                plan.max_subscriptions_per_recipient()
            );
        }
        Ok(())
    }

    /// Overrides a steady run's rate and duration (CLI `--rate`, `--duration-seconds`).
    pub fn override_rate(&mut self, rate: Option<f64>, duration: Option<f64>) -> anyhow::Result<()> {
        if rate.is_none() && duration.is_none() {
            return Ok(());
        }
        if self.envelopes.per_topic.is_some() {
            bail!("--rate and --duration-seconds apply to steady scenarios (rate_per_second) only");
        }
        if let Some(rate) = rate {
            self.envelopes.rate_per_second = Some(rate);
        }
        if let Some(duration) = duration {
            self.envelopes.duration_seconds = Some(duration);
        }
        self.validate()
    }

    /// Overrides `[setup].concurrency` and `[envelopes].batch_size` (CLI
    /// `--setup-concurrency`, `--batch-size`): one scenario file measures
    /// registration at several client counts and ingest at several batch sizes.
    pub fn override_sizes(
        &mut self,
        setup_concurrency: Option<usize>,
        batch_size: Option<usize>,
    ) -> anyhow::Result<()> {
        if let Some(concurrency) = setup_concurrency {
            self.setup.concurrency = concurrency;
        }
        if let Some(size) = batch_size {
            self.envelopes.batch_size = size;
        }
        self.validate()
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.timeouts.drain_seconds)
    }

    /// Overrides the `[outage]` table's kind, start and duration (CLI
    /// `--outage`, `--outage-start-seconds`, `--outage-seconds`).
    pub fn override_outage(
        &mut self,
        kind: Option<&str>,
        start_seconds: Option<f64>,
        duration_seconds: Option<f64>,
    ) -> anyhow::Result<()> {
        if kind.is_none() && start_seconds.is_none() && duration_seconds.is_none() {
            return Ok(());
        }
        let Some(outage) = self.outage.as_mut() else {
            bail!("--outage, --outage-start-seconds and --outage-seconds apply to scenarios with an [outage] table");
        };
        if let Some(kind) = kind {
            // `slow=<ms>` sets the delay too.
            if let Ok(fanout_testkit::OutageKind::Slow(delay)) = kind.parse() {
                if kind.contains('=') {
                    outage.slow_ms = delay.as_millis() as u64;
                }
                outage.kind = "slow".into();
            } else {
                outage.kind = kind.into();
            }
        }
        if let Some(start) = start_seconds {
            outage.start_seconds = start;
        }
        if let Some(duration) = duration_seconds {
            outage.duration_seconds = duration;
        }
        self.validate()
    }
}

/// The expanded scenario: topics, their subscribers, the envelopes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub recipients: u32,
    /// Subscribers of each topic.
    pub subscribers: Vec<u32>,
    /// Sum of the subscriber counts of the topics before each topic.
    prefix: Vec<u64>,
    /// Sum of all subscriber counts.
    total_subscriptions: u64,
    pub envelopes: u64,
    /// Steady rate (envelopes/s), or `None` for a burst.
    pub rate: Option<f64>,
    /// The channel the recipients register on.
    pub channel: ScenarioChannel,
}

impl Plan {
    /// Recipients register on the relay channel (spec 003).
    pub fn relay(&self) -> bool {
        self.channel == ScenarioChannel::Relay
    }

    /// The channel recipient `r` registers on: the scenario's, or in a mixed
    /// scenario HTTPS for even recipients and APNs for odd ones (so a topic
    /// of consecutive recipients has both, half and half).
    pub fn channel_of(&self, recipient: u32) -> ScenarioChannel {
        match self.channel {
            ScenarioChannel::Mixed if recipient % 2 == 0 => ScenarioChannel::Http,
            ScenarioChannel::Mixed => ScenarioChannel::Apns,
            channel => channel,
        }
    }

    pub fn new(scenario: &Scenario) -> Plan {
        let subscribers: Vec<u32> =
            scenario.topics.iter().flat_map(|g| std::iter::repeat_n(g.subscribers, g.count as usize)).collect();
        let mut prefix = Vec::with_capacity(subscribers.len());
        let mut sum = 0u64;
        for s in &subscribers {
            prefix.push(sum);
            sum += u64::from(*s);
        }
        let e = &scenario.envelopes;
        let (envelopes, rate) = match e.per_topic {
            Some(n) => (u64::from(n) * subscribers.len() as u64, None),
            None => {
                let rate = e.rate_per_second.unwrap_or(1.0);
                ((rate * e.duration_seconds.unwrap_or(1.0)).round().max(1.0) as u64, Some(rate))
            }
        };
        Plan {
            recipients: scenario.recipients,
            subscribers,
            prefix,
            total_subscriptions: sum,
            envelopes,
            rate,
            channel: scenario.channel,
        }
    }

    pub fn topics(&self) -> u32 {
        self.subscribers.len() as u32
    }

    pub fn total_subscriptions(&self) -> u64 {
        self.total_subscriptions
    }

    pub fn topic_of_envelope(&self, envelope: u64) -> u32 {
        (envelope % u64::from(self.topics())) as u32
    }

    /// The recipient in `slot` of topic `topic`.
    pub fn subscriber(&self, topic: u32, slot: u32) -> u32 {
        ((self.prefix[topic as usize] + u64::from(slot)) % u64::from(self.recipients)) as u32
    }

    /// The slot of `recipient` in `topic`, or `None` if it is not a subscriber.
    pub fn slot_of(&self, topic: u32, recipient: u32) -> Option<u32> {
        let (t, r, n) = (topic as usize, u64::from(recipient), u64::from(self.recipients));
        if t >= self.subscribers.len() || r >= n {
            return None;
        }
        let slot = (r + n - self.prefix[t] % n) % n;
        (slot < u64::from(self.subscribers[t])).then_some(slot as u32)
    }

    /// The topics `recipient` subscribes to, in topic order.
    pub fn topics_of(&self, recipient: u32) -> impl Iterator<Item = u32> + '_ {
        (0..self.topics()).filter(move |t| self.slot_of(*t, recipient).is_some())
    }

    pub fn max_subscriptions_per_recipient(&self) -> u64 {
        self.total_subscriptions.div_ceil(u64::from(self.recipients))
    }

    /// Deliveries expected from the first `envelopes` envelopes.
    pub fn expected_deliveries(&self, envelopes: u64) -> u64 {
        let topics = u64::from(self.topics());
        let (rounds, rest) = (envelopes / topics, envelopes % topics);
        let partial =
            if rest == 0 { 0 } else { self.prefix[rest as usize - 1] + u64::from(self.subscribers[rest as usize - 1]) };
        rounds * self.total_subscriptions + partial
    }

    /// The (envelope, slot) of delivery number `index` in envelope order.
    pub fn delivery_at(&self, index: u64) -> (u64, u32) {
        let (round, rest) = (index / self.total_subscriptions, index % self.total_subscriptions);
        // The last topic whose prefix is at most `rest`.
        let topic = self.prefix.partition_point(|p| *p <= rest) - 1;
        (round * u64::from(self.topics()) + topic as u64, (rest - self.prefix[topic]) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOKE: &str = r#"
        name = "t"
        recipients = 10
        [[topics]]
        count = 3
        subscribers = 4
        [[topics]]
        count = 1
        subscribers = 10
        [envelopes]
        per_topic = 2
        [engine.delivery]
        workers = 2
    "#;

    #[test]
    fn parses_and_expands_a_burst_scenario() {
        let s = Scenario::parse(SMOKE).unwrap();
        assert_eq!(s.name, "t");
        assert_eq!(s.envelopes.batch_size, 100);
        assert_eq!(s.setup.concurrency, 32);
        assert_eq!(s.max_attempts(), 3);
        assert_eq!(s.engine["delivery"]["workers"].as_integer(), Some(2));
        let plan = Plan::new(&s);
        assert_eq!(plan.topics(), 4);
        assert_eq!(plan.envelopes, 8);
        assert_eq!(plan.total_subscriptions(), 22);
        assert_eq!(plan.expected_deliveries(8), 44);
        assert_eq!(plan.expected_deliveries(1), 4);
        assert_eq!(plan.expected_deliveries(5), 22 + 4);
        // Every topic's subscribers are distinct and found again by slot_of.
        for t in 0..plan.topics() {
            let subs: std::collections::HashSet<u32> =
                (0..plan.subscribers[t as usize]).map(|slot| plan.subscriber(t, slot)).collect();
            assert_eq!(subs.len(), plan.subscribers[t as usize] as usize);
            for slot in 0..plan.subscribers[t as usize] {
                assert_eq!(plan.slot_of(t, plan.subscriber(t, slot)), Some(slot));
            }
        }
        // Subscriptions are spread evenly: 22 over 10 recipients is 2 or 3 each.
        let per: Vec<usize> = (0..10).map(|r| plan.topics_of(r).count()).collect();
        assert_eq!(per.iter().sum::<usize>(), 22);
        assert!(per.iter().all(|n| (2..=3).contains(n)), "{per:?}");
        // delivery_at walks envelopes in order.
        assert_eq!(plan.delivery_at(0), (0, 0));
        assert_eq!(plan.delivery_at(4), (1, 0));
        assert_eq!(plan.delivery_at(12), (3, 0));
        assert_eq!(plan.delivery_at(21), (3, 9));
        assert_eq!(plan.delivery_at(22), (4, 0));
    }

    #[test]
    fn parses_a_steady_scenario_with_faults_and_overrides() {
        let text = r#"
            name = "steady"
            recipients = 100
            topics = [{ count = 10, subscribers = 10 }]
            [envelopes]
            rate_per_second = 50.0
            duration_seconds = 2.0
            [faults]
            status_503 = 0.1
            delay = 0.05
            delay_ms = 200
        "#;
        let mut s = Scenario::parse(text).unwrap();
        assert_eq!(Plan::new(&s).envelopes, 100);
        assert_eq!(Plan::new(&s).rate, Some(50.0));
        assert_eq!(s.faults.failed_attempts(), 1);
        s.override_rate(Some(10.0), Some(3.0)).unwrap();
        assert_eq!(Plan::new(&s).envelopes, 30);
    }

    #[test]
    fn setup_concurrency_and_batch_size_overrides() {
        let mut s = Scenario::parse(SMOKE).unwrap();
        s.override_sizes(None, None).unwrap();
        assert_eq!((s.setup.concurrency, s.envelopes.batch_size), (32, 100));
        s.override_sizes(Some(16), Some(1)).unwrap();
        assert_eq!((s.setup.concurrency, s.envelopes.batch_size), (16, 1));
        // The envelopes are the same whatever the batch size.
        assert_eq!(Plan::new(&s).envelopes, 8);
        s.override_sizes(None, Some(100)).unwrap();
        assert_eq!((s.setup.concurrency, s.envelopes.batch_size), (16, 100));
        // Out of range: refused like the same values in the file.
        assert!(s.clone().override_sizes(Some(0), None).is_err());
        assert!(s.clone().override_sizes(None, Some(0)).is_err());
        assert!(s.override_sizes(None, Some(10_001)).is_err());
    }

    #[test]
    fn rejects_bad_scenarios() {
        let bad = [
            // Both burst and rate.
            SMOKE.replace("per_topic = 2", "per_topic = 2\nrate_per_second = 1.0\nduration_seconds = 1.0"),
            // More subscribers than recipients.
            SMOKE.replace("subscribers = 10", "subscribers = 11"),
            // Faults that would exhaust every attempt.
            format!("{SMOKE}\n[faults]\nstatus_503 = 0.5\nfailed_attempts = 3\n")
                .replace("[engine.delivery]\nworkers = 2", ""),
            // Fractions above one.
            SMOKE.replace("[engine.delivery]", "[faults]\nstatus_500 = 0.7\nstatus_404 = 0.7\n[engine.delivery]"),
            // Unknown key.
            SMOKE.replace("name = \"t\"", "name = \"t\"\nrecipient = 3"),
            // Over max_push_topics.
            SMOKE.replace("[engine.delivery]", "[engine]\nmax_push_topics = 2\n[engine.delivery]"),
        ];
        for text in bad {
            assert!(Scenario::parse(&text).is_err(), "accepted:\n{text}");
        }
    }

    #[test]
    fn apns_and_webpush_scenarios_have_one_host_and_retried_faults_only() {
        for (name, channel) in [("apns", ScenarioChannel::Apns), ("webpush", ScenarioChannel::WebPush)] {
            let text = SMOKE.replace("name = \"t\"", &format!("name = \"t\"\nchannel = \"{name}\""));
            assert_eq!(Plan::new(&Scenario::parse(&text).unwrap()).channel, channel);
            let faults = format!("{text}\n[faults]\nstatus_503 = 0.1\n").replace("[engine.delivery]\nworkers = 2", "");
            assert!(Scenario::parse(&faults).is_ok());
            for bad in [
                format!("{text}\n[faults]\nstatus_404 = 0.1\n").replace("[engine.delivery]\nworkers = 2", ""),
                text.replace("[envelopes]", "[mock]\nreceivers = 2\n[envelopes]"),
            ] {
                assert!(Scenario::parse(&bad).is_err(), "accepted:\n{bad}");
            }
        }
    }

    #[test]
    fn mixed_scenarios_need_an_outage_and_split_every_topic_between_the_channels() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut s = Scenario::load(&dir.join("outage.toml")).unwrap();
        let plan = Plan::new(&s);
        assert_eq!(plan.channel, ScenarioChannel::Mixed);
        assert_eq!((plan.recipients, plan.topics(), plan.envelopes), (2000, 20, 1000));
        // 50 webhooks and 50 APNs devices in every topic.
        for t in 0..plan.topics() {
            let apns = (0..100).filter(|slot| plan.channel_of(plan.subscriber(t, *slot)) == ScenarioChannel::Apns);
            assert_eq!(apns.count(), 50, "topic {t}");
        }
        assert_eq!(plan.expected_deliveries(plan.envelopes), 100_000);
        let outage = s.outage.clone().unwrap();
        assert_eq!(outage.kind().unwrap(), fanout_testkit::OutageKind::Hang);
        assert_eq!((outage.start(), outage.duration()), (Duration::ZERO, Duration::from_secs(30)));
        // The CLI's overrides, `slow=<ms>` setting the delay.
        s.override_outage(Some("slow=4500"), Some(2.0), Some(60.0)).unwrap();
        let outage = s.outage.clone().unwrap();
        assert_eq!(outage.kind().unwrap(), fanout_testkit::OutageKind::Slow(Duration::from_millis(4500)));
        assert_eq!((outage.start_seconds, outage.duration_seconds), (2.0, 60.0));
        s.override_outage(Some("503"), None, None).unwrap();
        assert_eq!(s.outage.as_ref().unwrap().kind().unwrap(), fanout_testkit::OutageKind::Unavailable);
        assert!(s.clone().override_outage(Some("flaky"), None, None).is_err());
        assert!(s.clone().override_outage(None, None, Some(0.0)).is_err());
        assert!(Scenario::parse(SMOKE).unwrap().override_outage(Some("hang"), None, None).is_err());

        let text = std::fs::read_to_string(dir.join("outage.toml")).unwrap();
        let bad = [
            // No outage, or an outage without mixed channels.
            text.split("[outage]").next().unwrap().to_owned() + "[engine]\n",
            text.replace("channel = \"mixed\"", ""),
            text.replace("kind = \"hang\"", "kind = \"flaky\""),
            text.replace("duration_seconds = 30", "duration_seconds = 0"),
            text.replace("[timeouts]", "[faults]\nstatus_503 = 0.1\n[timeouts]"),
        ];
        for text in bad {
            assert!(Scenario::parse(&text).is_err(), "accepted:\n{text}");
        }
        // Not mixed: every recipient on the scenario's channel.
        assert!((0..10).all(|r| Plan::new(&Scenario::parse(SMOKE).unwrap()).channel_of(r) == ScenarioChannel::Http));
    }

    /// The ingest and scale scenarios (docs/BENCHMARKS.md) measure what their
    /// comments say, at every override their documented commands use.
    #[test]
    fn ingest_and_scale_scenarios_have_their_documented_shape() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut ingest = Scenario::load(&dir.join("ingest.toml")).unwrap();
        let plan = Plan::new(&ingest);
        assert_eq!((plan.envelopes, plan.expected_deliveries(plan.envelopes)), (100_000, 100_000));
        for size in [1, 100] {
            ingest.override_sizes(None, Some(size)).unwrap();
            assert_eq!(Plan::new(&ingest).envelopes, 100_000);
        }

        let mut scale = Scenario::load(&dir.join("scale-10m.toml")).unwrap();
        let plan = Plan::new(&scale);
        assert_eq!(plan.total_subscriptions(), 10_000_000);
        // One envelope, to topic 0: a 100,000-delivery window.
        assert_eq!(plan.envelopes, 1);
        assert_eq!(plan.topic_of_envelope(0), 0);
        assert_eq!(plan.expected_deliveries(plan.envelopes), 100_000);
        // One UpdateSubscriptions per recipient, within the engine's default
        // max_subscription_changes (2,000) and max_push_topics.
        assert_eq!(plan.max_subscriptions_per_recipient(), 100);
        assert!(scale.setup.subscriptions_per_request >= 100);
        assert_eq!(plan.topics_of(99_999).count(), 100);
        // The harness plans per topic, not per subscription: 100 entries.
        assert_eq!(plan.subscribers.len(), 100);
        scale.override_rate(None, Some(0.01)).unwrap();
        let wider = Plan::new(&scale);
        assert_eq!((wider.envelopes, wider.expected_deliveries(wider.envelopes)), (10, 1_000_000));
    }

    #[test]
    fn window_10m_is_ten_million_deliveries_in_one_window_under_a_memory_ceiling() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/window-10m.toml");
        let scenario = Scenario::load(&path).unwrap();
        let plan = Plan::new(&scenario);
        assert_eq!(plan.envelopes, 100, "one per topic");
        assert_eq!(plan.expected_deliveries(plan.envelopes), 10_000_000);
        assert_eq!(plan.max_subscriptions_per_recipient(), 100);
        assert_eq!(scenario.max_peak_rss_mib, Some(1300.0), "the 1 GiB page cache plus 25 %");
    }

    #[test]
    fn checked_in_scenarios_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let s = Scenario::load(&path).unwrap();
                names.push(s.name);
            }
        }
        names.sort();
        assert_eq!(
            names,
            [
                "apns-smoke",
                "apns-throughput",
                "cluster",
                "delivery",
                "faults",
                "ingest",
                "many-topics",
                "nodes",
                "nodes-db",
                "outage",
                "publish",
                "registration",
                "relay-smoke",
                "scale-10m",
                "slow-receivers",
                "small-topics",
                "smoke",
                "soak",
                "webpush-smoke",
                "window-10m",
                "window-1m"
            ]
        );
    }
}
