//! fanout's engine: the domain, storage, the transport, the channels, and the
//! actors that ingest envelopes and dispatch deliveries. No gRPC or HTTP
//! server code lives here; `fanout-api` maps this crate's errors to statuses.
//! Every module imports only from the layers below it (docs/ARCHITECTURE.md,
//! "Layers"; `tests/layers.rs` checks it).

pub mod channel;
pub mod cluster_status;
pub mod delivery;
pub mod dispatch;
pub mod domain;
pub mod duration;
pub mod engine;
pub mod gateway;
pub mod ingest;
pub mod metrics;
pub mod ownership;
pub mod page;
pub mod registry;
pub mod relay_ingress;
pub mod retention;
pub mod settings;
pub mod shard_owners;
pub mod stale_marks;
pub mod store;
pub mod supervision;
pub mod supervisor;
#[cfg(test)]
mod testing;
mod ticker;
pub mod transport;

pub use engine::{Engine, EngineError, EngineOptions, NotReady, Readiness};
