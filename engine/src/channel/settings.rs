//! `[engine.channels]`: one optional table per channel. The value types the
//! tables share are `common`'s.

use std::num::NonZeroUsize;

use serde::Deserialize;

use super::apns::ApnsSettings;
use super::fcm::FcmSettings;
use super::http::HttpSettings;
use super::relay::RelaySettings;
use super::webpush::WebPushSettings;

/// `[engine.channels]`: one optional table per channel, named as the channel
/// is everywhere else (`Channel::as_str`). A channel exists only when its table
/// is present (section 2, PUSH-210). With no `[engine.channels]` table at all,
/// the HTTPS channel is configured with safe defaults; once the table is
/// written, exactly the channels it lists exist (an empty table configures none).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSettings {
    pub http: Option<HttpSettings>,
    /// `[engine.channels.apns]`; absent by default.
    pub apns: Option<ApnsSettings>,
    /// `[engine.channels.fcm]`; absent by default.
    pub fcm: Option<FcmSettings>,
    /// `[engine.channels.relay]` (spec 003); absent by default.
    pub relay: Option<RelaySettings>,
    /// `[engine.channels.webpush]` (RFC 8030); absent by default.
    pub webpush: Option<WebPushSettings>,
}

impl ChannelSettings {
    /// What a deployment gets with no `[engine.channels]` table: HTTPS only.
    pub fn https_only() -> Self {
        Self { http: Some(HttpSettings::default()), ..Self::default() }
    }

    /// The requests the channels the delivery workers send through may have
    /// in flight together: the sum of their `max_in_flight`. The relay is
    /// not among them: it sends from its own queue (dispatch hands it its
    /// deliveries), never through the workers.
    pub fn max_in_flight(&self) -> usize {
        [
            self.http.as_ref().map(|s| s.max_in_flight),
            self.apns.as_ref().map(|s| s.max_in_flight),
            self.fcm.as_ref().map(|s| s.max_in_flight),
            self.webpush.as_ref().map(|s| s.max_in_flight),
        ]
        .into_iter()
        .flatten()
        .map(NonZeroUsize::get)
        .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(json: serde_json::Value) -> Result<ChannelSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn provider_channel_tables_are_absent_by_default() {
        let c = ChannelSettings::https_only();
        assert!(c.http.is_some() && c.apns.is_none() && c.fcm.is_none(), "no table: HTTPS only");
        let c = channels(serde_json::json!({})).unwrap();
        assert!(c.http.is_none() && c.apns.is_none() && c.fcm.is_none(), "an empty table: no channel");
        let c = channels(serde_json::json!({"http": {}})).unwrap();
        assert!(c.http.is_some() && c.apns.is_none(), "an empty http table configures HTTPS");
    }

    #[test]
    fn the_workers_bound_sums_the_channels_they_send_through() {
        let mut c = ChannelSettings::https_only();
        assert_eq!(c.max_in_flight(), 1000);
        c.relay = Some(RelaySettings::default());
        assert_eq!(c.max_in_flight(), 1000, "the relay sends from its own queue");
    }
}
