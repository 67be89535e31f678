use std::time::Duration;

/// The outcomes of spec 000 section 7's table, with the retry delay of the
/// ones that are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Retry after at least `delay`, up to max_attempts in total.
    Transient {
        delay: Duration,
    },
    /// The target says it does not exist, which one answer cannot be trusted
    /// for: retried like `Transient`, and terminal only when every attempt of
    /// the delivery answered so (the HTTPS row's 404/410).
    Gone {
        delay: Duration,
    },
    /// Stop after this attempt; keep the recipient.
    Rejected,
    /// The token belongs to another sender; keep the recipient.
    Mismatch,
    /// A dead token: delete the recipient unless it re-registered (PUSH-234).
    Terminal,
    /// No request reached the provider (a credential could not be fetched or
    /// signed): not an attempt (spec 000 "Terms"). Tried again after `delay`;
    /// it neither counts towards max_attempts nor settles a first attempt.
    NotSent {
        delay: Duration,
    },
}

impl Outcome {
    /// One outcome of each attempt label (`Gone` counts as `Transient`;
    /// `NotSent` is not an attempt), for creating the series at zero.
    pub const ATTEMPTED: [Outcome; 5] =
        [Self::Delivered, Self::transient(Duration::ZERO), Self::Rejected, Self::Mismatch, Self::Terminal];

    pub const fn transient(delay: Duration) -> Self {
        Self::Transient { delay }
    }

    /// The delay before the next attempt, for an outcome that is retried.
    pub fn retry_delay(&self) -> Option<Duration> {
        match self {
            Self::Transient { delay } | Self::Gone { delay } => Some(*delay),
            _ => None,
        }
    }

    /// Whether the provider answered with something other than a failure:
    /// any outcome but a transient one (5xx, 429, timeout, connection
    /// error) or none at all. The HTTPS channel's 404/410 is an answer.
    /// What the breakers count (`delivery::breaker`).
    pub fn answered_by_provider(&self) -> bool {
        !matches!(self, Self::Transient { .. } | Self::NotSent { .. })
    }

    /// A bounded label value for metrics. `Gone` is a transient attempt.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Transient { .. } | Self::Gone { .. } => "transient",
            Self::Rejected => "rejected",
            Self::Mismatch => "mismatch",
            Self::Terminal => "terminal",
            Self::NotSent { .. } => "not_sent",
        }
    }

    /// The label of a delivery that ended with this outcome: a retried one
    /// ended because `max_attempts` ran out.
    pub fn delivery_label(&self) -> &'static str {
        match self.retry_delay() {
            Some(_) => "exhausted",
            None => self.label(),
        }
    }
}
