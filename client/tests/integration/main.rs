//! The client against the real `fanout` binary (built and started by
//! `fanout-testkit`'s launcher), on 127.0.0.1 only. One test binary, one
//! module per concern.

mod common;
mod delivery;
mod errors;
mod sync;
