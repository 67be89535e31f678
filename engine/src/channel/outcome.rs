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

    /// Whether a request left (spec 000 "Terms": an attempt); `NotSent` is
    /// the one outcome of a send that is not.
    pub fn is_attempt(&self) -> bool {
        !matches!(self, Self::NotSent { .. })
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

/// What a provider answered an attempt, for the delivery history: the HTTP
/// status and, where the answer names one, its reason (APNs `reason`, FCM
/// `errorCode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub reason: Option<Reason>,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self { status, reason: None }
    }

    pub fn with_reason(status: u16, reason: Option<&str>) -> Self {
        Self { status, reason: reason.and_then(Reason::parse) }
    }
}

/// A provider's reason as operators see it: 1 to 64 of `A-Z a-z 0-9 _ . -`
/// (every reason APNs and FCM document). Anything else is not kept, so
/// nothing a provider echoes (a token, a URL) reaches the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    const MAX_LEN: usize = 64;

    pub fn parse(text: &str) -> Option<Self> {
        let symbol = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        (!text.is_empty() && text.len() <= Self::MAX_LEN && text.chars().all(symbol)).then(|| Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One attempt as a channel reports it: the table's outcome and the
/// provider's answer when one came (none: a timeout, a connection error, a
/// request not sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub outcome: Outcome,
    pub answer: Option<Answer>,
}

impl Sent {
    pub fn answered(outcome: Outcome, answer: Answer) -> Self {
        Self { outcome, answer: Some(answer) }
    }
}

impl From<Outcome> for Sent {
    fn from(outcome: Outcome) -> Self {
        Self { outcome, answer: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_a_short_symbol_or_nothing() {
        assert_eq!(Reason::parse("BadDeviceToken").map(|r| r.as_str().to_owned()), Some("BadDeviceToken".into()));
        assert_eq!(Reason::parse("UNREGISTERED").map(|r| r.as_str().to_owned()), Some("UNREGISTERED".into()));
        for refused in ["", "https://evil.example/x", "a b", "token=abc", &"x".repeat(65), "émoji"] {
            assert_eq!(Reason::parse(refused), None, "{refused}");
        }
    }
}
