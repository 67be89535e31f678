use std::sync::Arc;

use fanout_engine::domain::RegistrationInput;
use fanout_engine::metrics::Metrics;
use fanout_engine::registry::{DeliveryInput, RecipientState, Registry, SubscriptionInput};
use fanout_proto::v1 as pb;
use pb::notification_service_server::NotificationService;
use tonic::{Request, Response, Status};

use super::status::{REGISTER, UNREGISTER, UPDATE_SUBSCRIPTIONS, admission_status, record_rpc};

pub struct NotificationApi {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
}

impl NotificationApi {
    fn count<T>(&self, method: &'static str, result: &Result<T, Status>) {
        record_rpc(&self.metrics, method, result);
    }
}

fn state(s: RecipientState) -> pb::RecipientState {
    let channel = i32::from(s.channel.wire());
    pb::RecipientState { topic_count: s.topic_count, channel, expires_at_ns: s.expires_at_ns }
}

#[tonic::async_trait]
impl NotificationService for NotificationApi {
    async fn register(&self, request: Request<pb::RegisterRequest>) -> Result<Response<pb::RecipientState>, Status> {
        let r = request.into_inner();
        let delivery = r.delivery.as_ref().map(|d| match d {
            pb::register_request::Delivery::Apns(a) => DeliveryInput::Apns { token: &a.token },
            pb::register_request::Delivery::Fcm(f) => DeliveryInput::Fcm { token: &f.token },
            pb::register_request::Delivery::Http(h) => DeliveryInput::Http { url: &h.url, signing_key: &h.signing_key },
            pb::register_request::Delivery::Relay(r) => DeliveryInput::Relay(RegistrationInput {
                provider: &r.provider,
                token: &r.token,
                app_id: r.app_id.as_deref(),
                sandbox: r.sandbox,
                p256dh: r.p256dh.as_deref(),
                auth: r.auth.as_deref(),
            }),
            pb::register_request::Delivery::Webpush(w) => {
                DeliveryInput::WebPush { endpoint: &w.endpoint, p256dh: &w.p256dh, auth: &w.auth }
            }
        });
        let result = self
            .registry
            .register(&r.recipient_id, &r.recipient_secret, delivery)
            .await
            .map(|s| Response::new(state(s)))
            .map_err(admission_status);
        self.count(REGISTER, &result);
        result
    }

    async fn unregister(
        &self,
        request: Request<pb::UnregisterRequest>,
    ) -> Result<Response<pb::UnregisterResponse>, Status> {
        let r = request.into_inner();
        let result = self
            .registry
            .unregister(&r.recipient_id, &r.recipient_secret)
            .await
            .map(|()| Response::new(pb::UnregisterResponse {}))
            .map_err(admission_status);
        self.count(UNREGISTER, &result);
        result
    }

    async fn update_subscriptions(
        &self,
        request: Request<pb::UpdateSubscriptionsRequest>,
    ) -> Result<Response<pb::RecipientState>, Status> {
        let r = request.into_inner();
        let adds: Vec<SubscriptionInput<'_>> = r
            .adds
            .iter()
            .map(|s| SubscriptionInput {
                topic: &s.topic,
                hmac_epoch_base: s.hmac_epoch_base,
                hmac_keys: &s.hmac_keys,
                include_commits: s.include_commits,
            })
            .collect();
        let result = self
            .registry
            .update_subscriptions(&r.recipient_id, &r.recipient_secret, &adds, &r.removes)
            .await
            .map(|s| Response::new(state(s)))
            .map_err(admission_status);
        self.count(UPDATE_SUBSCRIPTIONS, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    use fanout_engine::domain::Channel;
    use fanout_proto::v1 as pb;

    /// The proto enum is not generated from the channel table: they must
    /// name the same channels with the same numbers (PUSH-200).
    #[test]
    fn the_channel_table_matches_the_proto_enum() {
        for channel in Channel::ALL {
            let name = format!("CHANNEL_{}", channel.as_str().to_uppercase());
            let wire = pb::Channel::from_str_name(&name).unwrap_or_else(|| panic!("{name} is not in the proto"));
            assert_eq!(wire as i32, i32::from(channel.wire()), "{name}");
        }
        let in_proto = (1..=i32::from(u8::MAX)).filter(|n| pb::Channel::try_from(*n).is_ok()).count();
        assert_eq!(in_proto, Channel::ALL.len(), "a proto channel without a row");
        // The engine's `#[cfg(test)]` row is compiled only into the engine's
        // own test build, never into the engine this crate links.
        assert_eq!(Channel::parse("probe"), None);
    }
}
