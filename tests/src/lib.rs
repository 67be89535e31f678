//! Helpers for fanout's end-to-end tests: the engine process, a DNS server, an
//! HTTP proxy and request builders. Every socket is on 127.0.0.1.

pub mod client;
pub mod dns;
pub mod engine;
pub mod proxy;

pub use engine::{EngineConfig, Fanout, fanout_binary};
