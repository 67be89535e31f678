//! End-to-end tests: the real `fanout` binary, the real mock providers of
//! `fanout-testkit`, real sockets on 127.0.0.1 only. One test binary, one
//! module per concern.

mod admission;
mod apns_requests;
mod channel_isolation;
mod cluster_status;
mod common;
mod db_faults;
mod delivery;
mod delivery_history;
mod dispatch;
mod dns_failures;
mod gateway;
mod hostile;
mod listeners;
mod live_prometheus;
mod multinode;
mod operability;
mod outbound_proxy;
mod providers;
mod publish_stream;
mod relay;
mod relay_ingress;
mod relay_pair;
mod replay;
mod secrecy;
mod security;
mod standard_webhooks;
mod stopping;
mod subscriptions;
mod webhook_bodies;
mod webhook_outcomes;
mod webhook_safety;
mod webpush;
