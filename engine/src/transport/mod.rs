//! How the channels reach the outside, knowing no channel: the shared HTTP
//! client (`pool`: connections per host, in-flight bound, rate limit,
//! response-body cap), its HTTP/2 client (`http2`) and ALPN memory, the TLS
//! client configuration, and the destination guard (`destination`, PUSH-256)
//! with the checked pool of the channels that send to recipients' URLs
//! (`checked`), and the outbound proxy connections may tunnel through
//! (`proxy`).

mod alpn;
pub mod checked;
mod connector;
pub mod destination;
pub mod http2;
pub mod pool;
pub mod proxy;
pub mod tls;

use std::time::Duration;

pub use tls::client_tls_config;

/// Section 7: every attempt, credential fetches included, is bounded to 10 s.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
