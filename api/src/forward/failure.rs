//! Why a forward failed, as the `reason` label and the error detail name it.

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Failure {
    /// No connection to the owner could be opened (refused, or its address
    /// is none), or the call never reached it (its stream refused by the
    /// owner's GOAWAY, or never sent): nothing was sent.
    NotConnected,
    /// The connection to the owner broke before the answer, or could not be
    /// opened in time.
    Unreachable,
    /// The forward's deadline passed before the owner answered.
    Timeout,
    /// `max_in_flight_per_node` forwards to the owner were in flight until
    /// the deadline: this one was never sent.
    InFlight,
    /// The owner answered the whole request with an error status (its
    /// credentials check, its storage).
    Refused,
    /// The owner's answer did not hold one result per envelope.
    Malformed,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the owner may have stored the envelopes: only a forward never
    /// sent surely stored nothing.
    pub fn outcome_unknown(self) -> bool {
        !matches!(self, Failure::InFlight | Failure::NotConnected)
    }
}
