//! The backend as the client sees it: fanout.v1.NotificationService over
//! tonic, every call bounded (PUSH-240), every failure one [`Error`] kind.

use std::time::Duration;

use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::error::{Error, ErrorKind, Rpc, status_error};
use crate::identity::RecipientIdentity;
use crate::state::DeliveryTarget;

/// PUSH-240: no notification request waits longer than this on the backend.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The backend's view after a successful Register or UpdateSubscriptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecipientState {
    pub topic_count: u64,
    pub channel: pb::Channel,
    pub expires_at_ns: i64,
}

impl From<pb::RecipientState> for RecipientState {
    fn from(s: pb::RecipientState) -> RecipientState {
        RecipientState {
            topic_count: s.topic_count,
            channel: pb::Channel::try_from(s.channel).unwrap_or(pb::Channel::Unspecified),
            expires_at_ns: s.expires_at_ns,
        }
    }
}

/// Where the backend is and how long a request may wait.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// `http://host:port` or `https://host:port` (rustls with the system
    /// roots, plus `extra_ca_pem` when set).
    pub endpoint: String,
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Each request's bound, at most [`MAX_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
}

impl BackendConfig {
    pub fn new(endpoint: impl Into<String>) -> BackendConfig {
        BackendConfig { endpoint: endpoint.into(), extra_ca_pem: None, request_timeout: MAX_REQUEST_TIMEOUT }
    }
}

/// A connected (lazily: nothing is dialled until the first request) client
/// of the notification service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Backend {
    client: NotificationServiceClient<Channel>,
    timeout: Duration,
}

/// A lazily connected channel for `config`, shared with the publisher.
pub(crate) fn channel(config: &BackendConfig) -> Result<Channel, Error> {
    let invalid = |what: &str| Error::new(ErrorKind::InvalidConfig, format!("backend endpoint: {what}"));
    if config.request_timeout.is_zero() || config.request_timeout > MAX_REQUEST_TIMEOUT {
        return Err(Error::new(ErrorKind::InvalidConfig, "request_timeout must be above zero and at most 30 s"));
    }
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone()).map_err(|_| invalid("not a URI"))?;
    endpoint = endpoint.connect_timeout(config.request_timeout);
    if config.endpoint.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(pem) = &config.extra_ca_pem {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(|_| invalid("TLS setup failed"))?;
    } else if !config.endpoint.starts_with("http://") {
        return Err(invalid("the scheme must be http or https"));
    }
    Ok(endpoint.connect_lazy())
}

impl Backend {
    pub fn new(config: &BackendConfig) -> Result<Backend, Error> {
        Ok(Backend { client: NotificationServiceClient::new(channel(config)?), timeout: config.request_timeout })
    }

    /// Runs one call under the bound; a late answer is a timeout.
    async fn bounded<T>(
        &self,
        rpc: Rpc,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(status_error(&status, rpc)),
            Err(_) => {
                Err(Error::new(ErrorKind::Timeout, format!("{} got no answer within {:?}", rpc.name(), self.timeout)))
            }
        }
    }

    pub async fn register(
        &self,
        identity: &RecipientIdentity,
        target: &DeliveryTarget,
    ) -> Result<RecipientState, Error> {
        use pb::register_request::Delivery;
        let delivery = match target {
            DeliveryTarget::Apns { token } => Delivery::Apns(pb::ApnsDelivery { token: token.clone() }),
            DeliveryTarget::Fcm { token } => Delivery::Fcm(pb::FcmDelivery { token: token.clone() }),
            DeliveryTarget::Http { url, signing_key } => {
                Delivery::Http(pb::HttpDelivery { url: url.clone(), signing_key: signing_key.clone() })
            }
        };
        let request = pb::RegisterRequest {
            recipient_id: identity.id().to_vec(),
            recipient_secret: identity.secret().to_vec(),
            delivery: Some(delivery),
        };
        let mut client = self.client.clone();
        self.bounded(Rpc::Register, client.register(request)).await.map(RecipientState::from)
    }

    pub async fn unregister(&self, identity: &RecipientIdentity) -> Result<(), Error> {
        let request = pb::UnregisterRequest {
            recipient_id: identity.id().to_vec(),
            recipient_secret: identity.secret().to_vec(),
        };
        let mut client = self.client.clone();
        self.bounded(Rpc::Unregister, client.unregister(request)).await.map(|_| ())
    }

    pub async fn update_subscriptions(
        &self,
        identity: &RecipientIdentity,
        adds: Vec<pb::Subscription>,
        removes: Vec<Vec<u8>>,
    ) -> Result<RecipientState, Error> {
        let request = pb::UpdateSubscriptionsRequest {
            recipient_id: identity.id().to_vec(),
            recipient_secret: identity.secret().to_vec(),
            adds,
            removes,
        };
        let mut client = self.client.clone();
        self.bounded(Rpc::UpdateSubscriptions, client.update_subscriptions(request)).await.map(RecipientState::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn request_timeouts_above_30_s_or_zero_are_refused() {
        let mut config = BackendConfig::new("http://127.0.0.1:1");
        assert!(Backend::new(&config).is_ok());
        config.request_timeout = Duration::from_secs(31);
        assert_eq!(Backend::new(&config).unwrap_err().kind(), ErrorKind::InvalidConfig);
        config.request_timeout = Duration::ZERO;
        assert_eq!(Backend::new(&config).unwrap_err().kind(), ErrorKind::InvalidConfig);
    }

    #[tokio::test]
    async fn only_http_and_https_endpoints_are_taken() {
        assert_eq!(Backend::new(&BackendConfig::new("ftp://x:1")).unwrap_err().kind(), ErrorKind::InvalidConfig);
        assert!(Backend::new(&BackendConfig::new("https://localhost:1")).is_ok());
    }

    #[tokio::test]
    async fn a_backend_that_is_not_there_is_unavailable_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let backend = Backend::new(&BackendConfig::new(format!("http://127.0.0.1:{port}"))).unwrap();
        let identity = RecipientIdentity::from_parts([1; 32], [2; 32]);
        let err = backend.unregister(&identity).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }
}
