use std::time::Duration;

/// The five outcomes of spec 000 section 7, with the retry delay of a transient one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Retry after at least `delay`, up to max_attempts in total. `gone` marks
    /// an HTTPS 404/410: terminal when every attempt answered that way.
    Transient { delay: Duration, gone: bool },
    /// Stop after this attempt; keep the recipient.
    Rejected,
    /// The token belongs to another sender; keep the recipient.
    Mismatch,
    /// A dead token: delete the recipient unless it re-registered (PUSH-234).
    Terminal,
}

impl Outcome {
    pub const fn transient(delay: Duration) -> Self {
        Self::Transient { delay, gone: false }
    }

    /// A bounded label value for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Transient { .. } => "transient",
            Self::Rejected => "rejected",
            Self::Mismatch => "mismatch",
            Self::Terminal => "terminal",
        }
    }
}
