//! The load harness for fanout (`fanout-loadtest run` and `ceiling`). The
//! mock providers and the test PKI it drives are in `fanout-testkit`.

pub mod run;
