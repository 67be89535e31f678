//! The log: a tracing filter from `log.level` (or RUST_LOG), text or JSON
//! lines on stderr.
//!
//! PUSH-254 at debug level: the HTTP, HTTP/2, TLS and DNS crates
//! under the channels log where they connect at debug (a webhook's host and
//! port: `pooling idle connection for ("https", host:port)`; the name a TLS
//! session is cached for; the name a DNS query asks) and more at trace. A
//! webhook host is the registrant's, so these crates are held at `warn`
//! whenever the filter enables more than that, unless the filter names the
//! crate itself (`log.level = "debug,hyper_util=debug"` to debug a
//! connection problem, knowing what it prints).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

use crate::config::{Config, LogFormat};

/// Crates that print connection destinations, DNS names or headers below `warn`.
const DESTINATION_LOGGERS: &[&str] = &[
    "h2",
    "hickory_net",
    "hickory_proto",
    "hickory_resolver",
    "hyper",
    "hyper_rustls",
    "hyper_util",
    "rustls",
    "tokio_rustls",
];

pub fn init(config: &Config) {
    let directives = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = filter(directives.as_deref().unwrap_or(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(config.log.color.enabled(std::io::IsTerminal::is_terminal(&std::io::stderr())));
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// `directives`, with every crate of `DESTINATION_LOGGERS` that they do not
/// name held at `warn` when they enable anything more verbose.
fn filter(directives: &str) -> EnvFilter {
    let mut filter = EnvFilter::new(directives);
    if filter.max_level_hint().is_some_and(|max| max <= LevelFilter::WARN) {
        return filter;
    }
    let named: Vec<&str> = directives.split(',').map(|d| d.split(['=', '[']).next().unwrap_or("").trim()).collect();
    for krate in DESTINATION_LOGGERS {
        let mentioned = named.iter().any(|t| t == krate || t.starts_with(&format!("{krate}::")));
        if !mentioned {
            filter = filter.add_directive(format!("{krate}=warn").parse().expect("a valid directive"));
        }
    }
    filter
}

#[cfg(test)]
mod tests {
    use super::*;

    use tracing::Level;
    use tracing::subscriber::with_default;

    /// Whether an event at `level` for `target` passes `directives`.
    fn passes(directives: &str, target: &'static str, level: Level) -> bool {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let seen = Arc::new(AtomicBool::new(false));
        let writer_seen = seen.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(directives))
            .with_writer(move || {
                writer_seen.store(true, Ordering::SeqCst);
                std::io::sink()
            })
            .finish();
        with_default(subscriber, || match (target, level) {
            ("hyper_util::client::legacy::pool", Level::DEBUG) => {
                tracing::debug!(target: "hyper_util::client::legacy::pool", "x")
            }
            ("hyper_util::client::legacy::pool", Level::WARN) => {
                tracing::warn!(target: "hyper_util::client::legacy::pool", "x")
            }
            ("hickory_proto::xfer", Level::DEBUG) => tracing::debug!(target: "hickory_proto::xfer", "x"),
            ("rustls::client::hs", Level::DEBUG) => tracing::debug!(target: "rustls::client::hs", "x"),
            ("fanout_engine::dispatch", Level::DEBUG) => tracing::debug!(target: "fanout_engine::dispatch", "x"),
            ("fanout_engine::dispatch", Level::INFO) => tracing::info!(target: "fanout_engine::dispatch", "x"),
            other => panic!("no event for {other:?}"),
        });
        seen.load(Ordering::SeqCst)
    }

    #[test]
    fn destinations_stay_out_of_debug_logs_unless_asked_for() {
        let pool = "hyper_util::client::legacy::pool";
        // Debug everywhere: fanout's own debug lines, not the connection pool's.
        assert!(passes("debug", "fanout_engine::dispatch", Level::DEBUG));
        assert!(!passes("debug", pool, Level::DEBUG));
        assert!(!passes("trace", "hickory_proto::xfer", Level::DEBUG));
        assert!(!passes("fanout_engine=debug,info", "rustls::client::hs", Level::DEBUG));
        // Their warnings still pass.
        assert!(passes("debug", pool, Level::WARN));
        // Named, they log as asked.
        assert!(passes("debug,hyper_util=debug", pool, Level::DEBUG));
        assert!(passes("info,hyper_util::client=debug", pool, Level::DEBUG));
        // A quiet filter stays as it was: nothing is raised to warn.
        assert!(!passes("error", pool, Level::WARN));
        assert!(!passes("warn", "fanout_engine::dispatch", Level::INFO));
        assert!(passes("info", "fanout_engine::dispatch", Level::INFO));
    }
}
