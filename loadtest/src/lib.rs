//! The load harness for fanout (`fanout-loadtest run`, `ceiling` and
//! `gateway`). The
//! mock providers and the test PKI it drives are in `fanout-testkit`.

pub mod gateway;
pub mod run;
