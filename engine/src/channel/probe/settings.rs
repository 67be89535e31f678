use std::num::NonZeroUsize;

use serde::Deserialize;

use crate::channel::common::default_max_in_flight;

/// `[engine.channels.probe]`: what the delivery workers' bound needs of a
/// provider's table, and nothing else.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProbeSettings {
    /// Counted in the workers' bound (`ChannelSettings::max_in_flight`) as
    /// every provider's is. Default 1000.
    pub max_in_flight: NonZeroUsize,
}

impl crate::channel::common::TrustedCas for ProbeSettings {}

impl Default for ProbeSettings {
    fn default() -> Self {
        Self { max_in_flight: default_max_in_flight() }
    }
}
