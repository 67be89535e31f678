//! fanout's engine: the domain, storage, channels (with webhook safety and signing),
//! and the actors that ingest envelopes and dispatch deliveries. No gRPC or HTTP
//! server code lives here; `fanout-api` maps this crate's errors to statuses.

pub mod channel;
pub mod delivery;
pub mod dispatch;
pub mod domain;
pub mod engine;
pub mod gateway;
pub mod ingest;
pub mod metrics;
pub mod ownership;
pub mod registry;
pub mod relay_ingress;
pub mod retention;
pub mod settings;
pub mod store;
pub mod supervisor;
#[cfg(test)]
mod testing;
mod ticker;

pub use engine::{Engine, EngineError, EngineOptions, NotReady, Readiness};
