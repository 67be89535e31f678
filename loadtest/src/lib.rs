//! The load harness for fanout (`fanout-loadtest run`, `ceiling`,
//! `gateway` and `relay-ingress`). The mock providers and the test PKI it
//! drives are in `fanout-testkit`.

pub mod gateway;
pub mod platform_channels;
pub mod profile;
pub mod relay_ingress;
pub mod run;
