//! Publishing a group message as spec 000 §4 and §6 want it from a sender:
//! should_push from the app for an application message, true when the app
//! gave none, false for commits and proposals (PUSH-218); sender_hmac under
//! the group's key for the current epoch by the sender's clock (PUSH-258).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fanout_proto::v1 as pb;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use tonic::transport::Channel;

use crate::backend::{BackendConfig, channel};
use crate::error::{Error, ErrorKind};
use crate::host::{Clock, Keys, SystemClock};
use crate::sender_key::{GroupKey, HmacEpoch, RootKey};
use crate::topic::GroupId;

/// What kind of group message is sent, with the app's push choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// An application message; `should_push: None` means the app gave no
    /// value, which pushes.
    Application {
        should_push: Option<bool>,
    },
    Commit,
    Proposal,
}

impl Outgoing {
    /// PUSH-218.
    pub fn should_push(self) -> bool {
        match self {
            Outgoing::Application { should_push } => should_push.unwrap_or(true),
            Outgoing::Commit | Outgoing::Proposal => false,
        }
    }

    fn envelope_kind(self) -> pb::EnvelopeKind {
        match self {
            Outgoing::Application { .. } => pb::EnvelopeKind::Application,
            Outgoing::Commit => pb::EnvelopeKind::Commit,
            Outgoing::Proposal => pb::EnvelopeKind::Proposal,
        }
    }
}

/// The envelope for `data` (the ciphertext, the HMAC input) sent to `group`
/// at `now`. Without a root key there is no sender_hmac, and the backend
/// fails open: the sender's own devices are woken (spec 000 §6).
pub fn envelope(
    group: &GroupId,
    data: Vec<u8>,
    outgoing: Outgoing,
    root: Option<&RootKey>,
    now: SystemTime,
) -> pb::Envelope {
    let sender_hmac = root
        .map(|root| GroupKey::derive(root, group, HmacEpoch::at(now)).sender_hmac(&data).to_vec())
        .unwrap_or_default();
    pb::Envelope {
        topic: group.topic().as_bytes().to_vec(),
        kind: outgoing.envelope_kind() as i32,
        should_push: outgoing.should_push(),
        sender_hmac,
        data,
        ..pb::Envelope::default()
    }
}

/// Sends group messages through `fanout.v1.PublishService`. A stand-in for
/// the network's own publish path (API-210), which fanout tails.
#[derive(Clone)]
pub struct Publisher {
    client: PublishServiceClient<Channel>,
    keys: Arc<dyn Keys>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl Publisher {
    pub fn new(config: &BackendConfig, keys: Arc<dyn Keys>) -> Result<Publisher, Error> {
        Ok(Publisher {
            client: PublishServiceClient::new(channel(config)?),
            keys,
            clock: Arc::new(SystemClock),
            timeout: config.request_timeout,
        })
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Publisher {
        self.clock = clock;
        self
    }

    /// Publishes one message and returns its sequence id.
    pub async fn publish(&self, group: &GroupId, data: Vec<u8>, outgoing: Outgoing) -> Result<u64, Error> {
        let root = self.keys.root_key()?;
        let envelope = envelope(group, data, outgoing, root.as_ref(), self.clock.now());
        let mut client = self.client.clone();
        let request = pb::PublishRequest { envelopes: vec![envelope] };
        let response = tokio::time::timeout(self.timeout, client.publish(request))
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("Publish got no answer within {:?}", self.timeout)))?
            .map_err(|s| Error::new(ErrorKind::Unavailable, format!("Publish answered {:?}", s.code())))?
            .into_inner();
        match response.results.into_iter().next().and_then(|r| r.result) {
            Some(pb::publish_result::Result::SequenceId(id)) => Ok(id),
            Some(pb::publish_result::Result::Error(e)) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("Publish refused the envelope with {:?}", tonic::Code::from(e.code)),
            )),
            None => Err(Error::new(ErrorKind::Unavailable, "Publish answered no result")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_push_is_the_apps_value_or_true_and_false_for_commits_and_proposals() {
        assert!(Outgoing::Application { should_push: None }.should_push());
        assert!(Outgoing::Application { should_push: Some(true) }.should_push());
        assert!(!Outgoing::Application { should_push: Some(false) }.should_push());
        assert!(!Outgoing::Commit.should_push());
        assert!(!Outgoing::Proposal.should_push());
    }

    #[test]
    fn the_envelope_carries_the_checklist_hmac_at_1700000000() {
        let group = GroupId::new(hex::decode("0102030405060708").unwrap()).unwrap();
        let root = RootKey::new(&[0x2a; 42]).unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let e = envelope(&group, b"hello".to_vec(), Outgoing::Application { should_push: None }, Some(&root), at);
        assert_eq!(hex::encode(&e.sender_hmac), "263f212b11cb867582adf355cc9166b2c66b91b4feb0765649e20076268bdb3c");
        assert_eq!(e.topic, group.topic().as_bytes());
        assert_eq!(e.kind, pb::EnvelopeKind::Application as i32);
        assert!(e.should_push);
        assert_eq!(e.data, b"hello");
        let commit = envelope(&group, b"c".to_vec(), Outgoing::Commit, Some(&root), at);
        assert!(!commit.should_push);
        assert_eq!(commit.sender_hmac.len(), 32, "commits are group messages: they carry the HMAC too");
        let keyless = envelope(&group, b"x".to_vec(), Outgoing::Proposal, None, at);
        assert!(keyless.sender_hmac.is_empty());
    }
}
