//! Provider outages a mock server can be switched into and out of while it
//! runs: a test (or the load harness's timing) starts one, the engine meets
//! it on its next request or connection, and ending it makes the mock healthy
//! again on the same address, so that "the provider came back" is a moment a
//! test can measure from.
//!
//! The kinds are the ways a provider fails as seen from its client:
//!
//! - [`OutageKind::Hang`]: connections and TLS work, requests are read and
//!   never answered (until the client resets the stream or closes).
//! - [`OutageKind::Refuse`]: nothing listens: new connections are refused
//!   (RST), open ones are closed. The port stays reserved, so the mock comes
//!   back on the same address.
//! - [`OutageKind::TlsStall`]: TCP connects, the TLS handshake never
//!   completes; open connections are closed when it starts, so the client
//!   must connect again and meets the stall.
//! - [`OutageKind::Slow`]: every request is answered normally, after a delay.
//! - [`OutageKind::Unavailable`]: every request is answered 503 at once, with
//!   the provider's own error body.
//!
//! Requests an outage holds, slows or refuses are counted here
//! ([`Outage::met`]); the mock records only the requests it serves.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// The delay of [`OutageKind::Slow`] when none is given: long enough to hold
/// a client's slots for seconds, short of the engine's 10 s attempt bound.
pub const DEFAULT_SLOW: Duration = Duration::from_secs(3);

/// How a provider fails (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageKind {
    Hang,
    Refuse,
    TlsStall,
    /// Every request answered normally, this much later.
    Slow(Duration),
    /// Every request answered 503.
    Unavailable,
}

impl OutageKind {
    /// The kinds, each under its CLI name (`slow` with [`DEFAULT_SLOW`]).
    pub const ALL: [OutageKind; 5] = [
        OutageKind::Hang,
        OutageKind::Refuse,
        OutageKind::TlsStall,
        OutageKind::Slow(DEFAULT_SLOW),
        OutageKind::Unavailable,
    ];

    /// The CLI and scenario name: `hang`, `refuse`, `tls-stall`, `slow`, `503`.
    pub fn name(self) -> &'static str {
        match self {
            OutageKind::Hang => "hang",
            OutageKind::Refuse => "refuse",
            OutageKind::TlsStall => "tls-stall",
            OutageKind::Slow(_) => "slow",
            OutageKind::Unavailable => "503",
        }
    }

    /// Whether it acts on connections (the accept loop) rather than on
    /// requests (the connection's service).
    fn on_connections(self) -> bool {
        matches!(self, OutageKind::Refuse | OutageKind::TlsStall)
    }
}

impl fmt::Display for OutageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutageKind::Slow(delay) => write!(f, "slow ({} ms)", delay.as_millis()),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for OutageKind {
    type Err = String;

    /// `hang`, `refuse`, `tls-stall`, `slow` (3 s), `slow=<ms>`, `503`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(ms) = s.strip_prefix("slow=") {
            let ms: u64 = ms.parse().map_err(|_| format!("slow=<milliseconds>, not {s:?}"))?;
            return Ok(OutageKind::Slow(Duration::from_millis(ms)));
        }
        OutageKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown outage {s:?}: one of hang, refuse, tls-stall, slow, slow=<ms>, 503"))
    }
}

/// The switch of one mock server: cloned into the server and kept by the
/// mock (and whoever drives it). Healthy when created.
#[derive(Clone, Debug)]
pub struct Outage {
    state: Arc<watch::Sender<Option<OutageKind>>>,
    met: Arc<AtomicU64>,
}

impl Default for Outage {
    fn default() -> Self {
        Outage::new()
    }
}

/// What the server does with one request.
pub(crate) enum Gate {
    /// Serve it as usual (possibly after the outage's delay).
    Serve,
    /// Answer 503 with the mock's error body.
    Unavailable,
}

impl Outage {
    pub fn new() -> Self {
        Outage { state: Arc::new(watch::Sender::new(None)), met: Arc::new(AtomicU64::new(0)) }
    }

    /// From now on the mock fails as `kind` says (replacing any outage on).
    pub fn start(&self, kind: OutageKind) {
        self.state.send_replace(Some(kind));
    }

    /// The mock is healthy again: new connections and requests are served.
    /// Requests a hang holds stay unanswered.
    pub fn end(&self) {
        self.state.send_replace(None);
    }

    /// The outage on now, if any.
    pub fn current(&self) -> Option<OutageKind> {
        *self.state.borrow()
    }

    /// Requests the outage held, slowed or answered 503, and connections it
    /// stalled in the handshake, since the mock started.
    pub fn met(&self) -> u64 {
        self.met.load(Ordering::Relaxed)
    }

    /// Healthy for `after`, then `kind` for `duration`, then healthy again
    /// (the harness's timing). The task ends with the outage; aborting it
    /// leaves the switch where it is.
    pub fn schedule(&self, kind: OutageKind, after: Duration, duration: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            me.start(kind);
            tokio::time::sleep(duration).await;
            me.end();
        })
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<OutageKind>> {
        self.state.subscribe()
    }

    pub(crate) fn count(&self) {
        self.met.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies the outage to one request: returns at once when healthy, after
    /// the delay when slow, never when hanging (the request's future is
    /// dropped when the client resets the stream or the connection closes).
    pub(crate) async fn gate(&self) -> Gate {
        match self.current() {
            None => Gate::Serve,
            Some(kind) if kind.on_connections() => Gate::Serve,
            Some(OutageKind::Hang) => {
                self.count();
                std::future::pending::<()>().await;
                Gate::Serve
            }
            Some(OutageKind::Slow(delay)) => {
                self.count();
                tokio::time::sleep(delay).await;
                Gate::Serve
            }
            Some(_) => {
                self.count();
                Gate::Unavailable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_their_cli_names() {
        for kind in OutageKind::ALL {
            assert_eq!(kind.name().parse::<OutageKind>(), Ok(kind));
        }
        assert_eq!("slow=250".parse::<OutageKind>(), Ok(OutageKind::Slow(Duration::from_millis(250))));
        assert!("flaky".parse::<OutageKind>().is_err());
        assert!("slow=soon".parse::<OutageKind>().is_err());
        assert_eq!(OutageKind::Slow(DEFAULT_SLOW).to_string(), "slow (3000 ms)");
        assert_eq!(OutageKind::Unavailable.to_string(), "503");
    }

    #[tokio::test]
    async fn a_schedule_turns_the_outage_on_then_off() {
        let outage = Outage::new();
        let ms = Duration::from_millis;
        let task = outage.schedule(OutageKind::Unavailable, ms(200), ms(400));
        tokio::time::sleep(ms(100)).await;
        assert_eq!(outage.current(), None);
        tokio::time::sleep(ms(200)).await;
        assert_eq!(outage.current(), Some(OutageKind::Unavailable));
        assert!(matches!(outage.gate().await, Gate::Unavailable));
        tokio::time::sleep(ms(400)).await;
        assert_eq!(outage.current(), None);
        assert!(matches!(outage.gate().await, Gate::Serve));
        task.await.unwrap();
        assert_eq!(outage.met(), 1);
    }

    /// Every kind against a running mock APNs, each switched on and off
    /// again: what a client meets during the outage, and a normal answer on
    /// the same address once it ended.
    mod against_a_mock {
        use std::net::SocketAddr;

        use bytes::Bytes;
        use http_body_util::{BodyExt as _, Full};

        use super::*;
        use crate::TestPki;
        use crate::mock::apns::{MockApns, MockApnsConfig, start};
        use crate::test_client::{TestClient, Versions, client};

        const SHORT: Duration = Duration::from_millis(500);

        async fn setup() -> (TestPki, MockApns, TestClient) {
            let pki = TestPki::generate(&[]).unwrap();
            let mock = start(&pki, MockApnsConfig::default()).await.unwrap();
            let client = client(&pki, Versions::Http2);
            (pki, mock, client)
        }

        /// A push's (status, body), or `None` when no answer came within `wait`.
        async fn push(client: &TestClient, mock: &MockApns, wait: Duration) -> Option<Result<(u16, String), String>> {
            let request = http::Request::post(format!("{}/3/device/abc", mock.base_url()))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let answer = async {
                let response = client.request(request).await.map_err(|e| format!("{e:?}"))?;
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
                Ok((status, String::from_utf8_lossy(&body).into_owned()))
            };
            tokio::time::timeout(wait, answer).await.ok()
        }

        async fn healthy(client: &TestClient, mock: &MockApns) {
            assert_eq!(push(client, mock, Duration::from_secs(5)).await.map(|r| r.map(|a| a.0)), Some(Ok(200)));
        }

        #[tokio::test]
        async fn hang_holds_requests_until_it_ends() {
            let (_pki, mock, client) = setup().await;
            healthy(&client, &mock).await;
            mock.outage().start(OutageKind::Hang);
            assert_eq!(push(&client, &mock, SHORT).await, None, "no answer while hanging");
            assert_eq!(mock.outage().met(), 1);
            mock.outage().end();
            healthy(&client, &mock).await;
            assert_eq!(mock.received_count(), 2, "the hung request was not served");
        }

        #[tokio::test]
        async fn unavailable_answers_503_in_the_providers_words() {
            let (_pki, mock, client) = setup().await;
            mock.outage().start(OutageKind::Unavailable);
            let answer = push(&client, &mock, SHORT).await.unwrap().unwrap();
            assert_eq!(answer, (503, r#"{"reason":"ServiceUnavailable"}"#.to_owned()));
            mock.outage().end();
            healthy(&client, &mock).await;
            assert_eq!((mock.received_count(), mock.outage().met()), (1, 1));
        }

        #[tokio::test]
        async fn slow_answers_after_its_delay() {
            let (_pki, mock, client) = setup().await;
            healthy(&client, &mock).await;
            mock.outage().start(OutageKind::Slow(Duration::from_millis(400)));
            let started = std::time::Instant::now();
            assert_eq!(push(&client, &mock, Duration::from_secs(5)).await.map(|r| r.map(|a| a.0)), Some(Ok(200)));
            assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
            mock.outage().end();
            let started = std::time::Instant::now();
            healthy(&client, &mock).await;
            assert!(started.elapsed() < Duration::from_millis(400), "{:?}", started.elapsed());
        }

        /// Waits (briefly) until the accept loop acted on the switch.
        async fn settle() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        #[tokio::test]
        async fn refuse_closes_the_port_and_reopens_it_on_the_same_address() {
            let (_pki, mock, client) = setup().await;
            healthy(&client, &mock).await;
            mock.outage().start(OutageKind::Refuse);
            settle().await;
            let refused = tokio::net::TcpStream::connect(mock.addr()).await.map(|_| ()).map_err(|e| e.kind());
            assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused));
            assert!(matches!(push(&client, &mock, SHORT).await, Some(Err(_))), "the open connection was closed");
            mock.outage().end();
            settle().await;
            healthy(&client, &mock).await;
        }

        /// Whether a TLS handshake with the mock at `addr` completes within `wait`.
        async fn handshakes(pki: &TestPki, addr: SocketAddr, wait: Duration) -> bool {
            let mut config = (*pki.client_config()).clone();
            config.alpn_protocols = vec![b"h2".to_vec()];
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let tcp = tokio::net::TcpStream::connect(addr).await.expect("TCP connects");
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            matches!(tokio::time::timeout(wait, connector.connect(name, tcp)).await, Ok(Ok(_)))
        }

        #[tokio::test]
        async fn tls_stall_accepts_tcp_and_never_finishes_the_handshake() {
            let (pki, mock, client) = setup().await;
            healthy(&client, &mock).await;
            assert!(handshakes(&pki, mock.addr(), Duration::from_secs(5)).await);
            mock.outage().start(OutageKind::TlsStall);
            settle().await;
            assert!(!handshakes(&pki, mock.addr(), SHORT).await, "the handshake stalls");
            assert!(push(&client, &mock, SHORT).await.is_none_or(|r| r.is_err()), "no answer during the stall");
            assert!(mock.outage().met() >= 1);
            mock.outage().end();
            settle().await;
            assert!(handshakes(&pki, mock.addr(), Duration::from_secs(5)).await);
            healthy(&client, &mock).await;
        }
    }
}
