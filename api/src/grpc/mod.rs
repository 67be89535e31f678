//! The gRPC edge: proto ⇄ engine types, and engine errors → status, once.

mod answer;
mod batch;
mod call;
mod guard;
mod health;
mod notification;
mod publish;
mod publish_stream;
mod reroute;
mod status;

pub use call::router;
pub use guard::Guard;
pub use health::StoppingHealth;
pub use notification::NotificationApi;
pub use publish::PublishApi;
pub use status::initialise_metrics;

#[cfg(test)]
mod tests {
    //! The gRPC messages as the network delivers them, before
    //! the engine's parsers (property-tested beside them) see their fields.

    use fanout_proto::v1 as pb;
    use proptest::prelude::*;
    use prost::Message;

    /// Decodes `bytes` as `M`: on success, the message re-encodes to no more
    /// than it was sent as (unknown fields dropped, repeats merged), so what
    /// a request holds is bounded by the message size limit.
    fn decode_bounded<M: Message + Default>(bytes: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(message) = M::decode(bytes) {
            prop_assert!(message.encoded_len() <= bytes.len(), "{} > {}", message.encoded_len(), bytes.len());
        }
        Ok(())
    }

    fn envelope() -> impl Strategy<Value = pb::Envelope> {
        (
            prop::collection::vec(any::<u8>(), 0..40),
            any::<i32>(),
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..40),
            any::<u64>(),
            any::<i32>(),
            "\\PC{0,20}",
        )
            .prop_map(
                |(topic, kind, should_push, sender_hmac, data, sequence_id, membership_change, message_id)| {
                    pb::Envelope {
                        topic,
                        kind,
                        should_push,
                        sender_hmac,
                        data,
                        sequence_id,
                        membership_change,
                        message_id,
                    }
                },
            )
    }

    proptest! {
        /// Any bytes: each request decodes or is refused, within bounds.
        #[test]
        fn any_bytes_decode_within_bounds(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            decode_bounded::<pb::PublishRequest>(&bytes)?;
            decode_bounded::<pb::RegisterRequest>(&bytes)?;
            decode_bounded::<pb::UpdateSubscriptionsRequest>(&bytes)?;
            decode_bounded::<pb::UnregisterRequest>(&bytes)?;
        }

        /// What a publisher sends is what the engine is handed: encode and
        /// decode give back every field.
        #[test]
        fn envelopes_round_trip(envelopes in prop::collection::vec(envelope(), 0..4)) {
            let request = pb::PublishRequest { envelopes };
            let decoded = pb::PublishRequest::decode(request.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(decoded, request);
        }

        #[test]
        fn subscription_updates_round_trip(
            id in prop::collection::vec(any::<u8>(), 0..40),
            adds in prop::collection::vec(
                (
                    prop::collection::vec(any::<u8>(), 0..10),
                    any::<i64>(),
                    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..44), 0..4),
                    any::<bool>(),
                ),
                0..4,
            ),
            removes in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..10), 0..4),
        ) {
            let request = pb::UpdateSubscriptionsRequest {
                recipient_id: id.clone(),
                recipient_secret: id,
                adds: adds
                    .into_iter()
                    .map(|(topic, hmac_epoch_base, hmac_keys, include_commits)| pb::Subscription {
                        topic,
                        hmac_epoch_base,
                        hmac_keys,
                        include_commits,
                    })
                    .collect(),
                removes,
            };
            let decoded = pb::UpdateSubscriptionsRequest::decode(request.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(decoded, request);
        }
    }
}
