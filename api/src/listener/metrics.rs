//! `fanout_connections_closed_total{listener, reason}`: connections the
//! server closed for a listener limit. Every pair exists at zero from
//! start-up, so the first cut shows in `rate()`.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CloseReason {
    /// No complete first request (TLS handshake included) within
    /// `server.first_request_timeout_seconds`.
    FirstRequestTimeout,
    /// The TLS handshake took longer than `server.tls_handshake_timeout_seconds`.
    TlsHandshakeTimeout,
    /// The TLS handshake failed (no client certificate, bad protocol, ...).
    TlsHandshakeFailed,
    /// No request open for `server.idle_timeout_seconds`; closed gracefully.
    IdleTimeout,
}

impl CloseReason {
    pub const ALL: [CloseReason; 4] = [
        CloseReason::FirstRequestTimeout,
        CloseReason::TlsHandshakeTimeout,
        CloseReason::TlsHandshakeFailed,
        CloseReason::IdleTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The counters of one listener.
#[derive(Clone)]
pub struct Closes([IntCounter; 4]);

impl Closes {
    /// Registers the family in `registry` and returns each listener's
    /// counters, in the order of `listeners`.
    pub fn register<const N: usize>(registry: &Registry, listeners: [&str; N]) -> [Closes; N] {
        let family = IntCounterVec::new(
            Opts::new("fanout_connections_closed_total", "Connections the server closed for a listener limit."),
            &["listener", "reason"],
        )
        .expect("valid metric");
        registry.register(Box::new(family.clone())).expect("unique metric");
        listeners.map(|listener| Closes(CloseReason::ALL.map(|r| family.with_label_values(&[listener, r.as_str()]))))
    }

    pub fn count(&self, reason: CloseReason) {
        let at = CloseReason::ALL.iter().position(|r| *r == reason).expect("every reason is listed");
        self.0[at].inc();
    }

    #[cfg(test)]
    pub fn unregistered() -> Closes {
        Closes::register(&Registry::new(), ["test"]).into_iter().next().expect("one listener")
    }

    #[cfg(test)]
    pub fn get(&self, reason: CloseReason) -> u64 {
        let at = CloseReason::ALL.iter().position(|r| *r == reason).expect("every reason is listed");
        self.0[at].get()
    }
}
