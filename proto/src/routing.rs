//! The part of a per-envelope publish error that programs read: one
//! `google.rpc.ErrorInfo` in `PublishError.details`, as `google.rpc.Status`
//! carries it (publish.proto documents the reasons and metadata). The
//! server writes it and publishers read it through this one type, so
//! neither parses the message text, which is for people.

use std::collections::HashMap;

use prost::Message;
use prost_types::Any;
use tonic_types::pb::ErrorInfo;

use crate::v1::PublishError;

/// `ErrorInfo.domain` of fanout's details.
pub const DOMAIN: &str = "fanout.io";
/// The `Any` type URL of a `google.rpc.ErrorInfo`.
pub const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// Why an envelope was answered 14 UNAVAILABLE (`ErrorInfo.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Another node owns the shard: `owner` names it. Nothing stored.
    ShardOwnedElsewhere,
    /// No node owns the shard now (leases are moving). Nothing stored.
    ShardHasNoOwner,
    /// The shard's lease ran out while the envelope was stored: outcome unknown.
    LeaseLostWhileStoring,
    /// The forward to `owner` failed (`failure` says how).
    ForwardFailed,
}

impl Reason {
    const ALL: [Reason; 4] =
        [Reason::ShardOwnedElsewhere, Reason::ShardHasNoOwner, Reason::LeaseLostWhileStoring, Reason::ForwardFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ShardOwnedElsewhere => "SHARD_OWNED_ELSEWHERE",
            Reason::ShardHasNoOwner => "SHARD_HAS_NO_OWNER",
            Reason::LeaseLostWhileStoring => "LEASE_LOST_WHILE_STORING",
            Reason::ForwardFailed => "FORWARD_FAILED",
        }
    }

    pub fn parse(reason: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

/// The routing detail of one envelope's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    pub reason: Reason,
    pub shard: u32,
    /// The owner's gRPC address (`server.advertise_address`), when known.
    pub owner: Option<String>,
    /// The envelope may have been stored (and may be delivered): a resend
    /// may deliver it twice. False: surely nothing was stored.
    pub outcome_unknown: bool,
    /// With `ForwardFailed`: not_connected, unreachable, timeout, in_flight, refused or malformed.
    pub failure: Option<String>,
}

impl Routing {
    /// The detail as `PublishError.details` holds it.
    pub fn to_any(&self) -> Any {
        let mut metadata = HashMap::from([
            ("shard".to_owned(), self.shard.to_string()),
            ("outcome".to_owned(), if self.outcome_unknown { "unknown" } else { "not_stored" }.to_owned()),
        ]);
        if let Some(owner) = &self.owner {
            metadata.insert("owner".to_owned(), owner.clone());
        }
        if let Some(failure) = &self.failure {
            metadata.insert("failure".to_owned(), failure.clone());
        }
        let info = ErrorInfo { reason: self.reason.as_str().to_owned(), domain: DOMAIN.to_owned(), metadata };
        Any { type_url: ERROR_INFO_TYPE_URL.to_owned(), value: info.encode_to_vec() }
    }

    /// The routing detail of `error`: its first `ErrorInfo` of fanout's
    /// domain with a reason this version knows.
    pub fn of(error: &PublishError) -> Option<Routing> {
        error.details.iter().filter(|d| d.type_url == ERROR_INFO_TYPE_URL).find_map(|d| {
            let info = ErrorInfo::decode(d.value.as_slice()).ok()?;
            if info.domain != DOMAIN {
                return None;
            }
            let mut metadata = info.metadata;
            Some(Routing {
                reason: Reason::parse(&info.reason)?,
                shard: metadata.get("shard")?.parse().ok()?,
                owner: metadata.remove("owner"),
                outcome_unknown: metadata.get("outcome").is_none_or(|o| o != "not_stored"),
                failure: metadata.remove("failure"),
            })
        })
    }
}

/// `ErrorInfo.reason` of the status that ends a PublishStream because its
/// node shuts down (outcome `not_stored`): every batch answered before it
/// was stored, and none sent after the last answer was. A stream that ends
/// because storage failed carries no such detail: its last batch's outcome
/// is unknown.
pub const SHUTTING_DOWN: &str = "SHUTTING_DOWN";

/// The status a PublishStream ends with when its node shuts down: 14
/// UNAVAILABLE with an `ErrorInfo` (`SHUTTING_DOWN`, outcome `not_stored`)
/// in its details, so a program tells it from a failed store without
/// reading the message.
pub fn shutting_down(message: impl Into<String>) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let metadata = HashMap::from([("outcome".to_owned(), "not_stored".to_owned())]);
    let details = ErrorDetails::with_error_info(SHUTTING_DOWN, DOMAIN, metadata);
    tonic::Status::with_error_details(tonic::Code::Unavailable, message, details)
}

/// Whether `status` ended a PublishStream because its node shut down: the
/// batches sent after the last answer were not stored; send them again.
pub fn is_shutting_down(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::Unavailable
        && status.get_details_error_info().is_some_and(|info| {
            info.reason == SHUTTING_DOWN
                && info.domain == DOMAIN
                && info.metadata.get("outcome").map(String::as_str) == Some("not_stored")
        })
}

/// Whether a failed call was surely never processed by the node it went
/// to, so that sending it again, to that node or another, cannot store it
/// twice: its connection was refused, the node's GOAWAY refused its
/// stream, or the client never sent it. The status of a call a node
/// answered carries no transport error as its source.
pub fn never_processed(status: &tonic::Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if refused(error) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// One cause in a failed call's chain that proves it never processed:
/// refused at connect, a stream the node's GOAWAY refused (above its last
/// stream id: never processed, RFC 9113 section 6.8), or a call hyper
/// cancelled before handing it to its connection (queued as that
/// connection ended: after a GOAWAY, the call handed over next gets no
/// stream at all, and hyper answers it "canceled", never started).
pub fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    error.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        || error.downcast_ref::<h2::Error>().is_some_and(|e| e.is_go_away() && e.is_remote())
        || error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_canceled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_reads_back_as_written_and_others_are_ignored() {
        let routing = Routing {
            reason: Reason::ShardOwnedElsewhere,
            shard: 7,
            owner: Some("10.0.0.2:50051".into()),
            outcome_unknown: false,
            failure: None,
        };
        let foreign =
            ErrorInfo { reason: "SHARD_OWNED_ELSEWHERE".into(), domain: "other.example".into(), ..Default::default() };
        let error = PublishError {
            code: 14,
            message: "shard 7 is owned by 10.0.0.2:50051; publish there".into(),
            details: vec![
                Any { type_url: "type.googleapis.com/google.rpc.RetryInfo".into(), value: vec![] },
                Any { type_url: ERROR_INFO_TYPE_URL.into(), value: foreign.encode_to_vec() },
                routing.to_any(),
            ],
        };
        assert_eq!(Routing::of(&error), Some(routing));
        let failed = Routing {
            reason: Reason::ForwardFailed,
            shard: 3,
            owner: Some("[::1]:50052".into()),
            outcome_unknown: true,
            failure: Some("timeout".into()),
        };
        let error = PublishError { details: vec![failed.to_any()], ..PublishError::default() };
        assert_eq!(Routing::of(&error), Some(failed));
        assert_eq!(Routing::of(&PublishError::default()), None);
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
    }

    #[test]
    fn a_stream_ended_by_a_shutdown_says_so_in_its_details() {
        let status = shutting_down("the server is shutting down");
        assert_eq!((status.code(), status.message()), (tonic::Code::Unavailable, "the server is shutting down"));
        assert!(is_shutting_down(&status));
        // As the client reads it: the details travel in their own header.
        let sent = status.into_http::<tonic::body::Body>();
        let read = tonic::Status::from_header_map(sent.headers()).expect("a status");
        assert!(is_shutting_down(&read));
        assert!(!is_shutting_down(&tonic::Status::unavailable("storage failed")));
    }

    #[tokio::test]
    async fn a_call_never_sent_is_refused_and_one_that_broke_is_not() {
        // A connection whose task is gone (as after a GOAWAY): hyper never
        // hands the call to it.
        let (io, _server) = tokio::io::duplex(4096);
        let io = hyper_util::rt::TokioIo::new(io);
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
        drop(connection);
        let request = http::Request::post("http://node/fanout.v1.PublishService/Publish")
            .body(http_body_util::Empty::<&[u8]>::new())
            .unwrap();
        let never_sent = sender.send_request(request).await.unwrap_err();
        assert!(never_sent.is_canceled(), "{never_sent:?}");
        assert!(refused(&never_sent));
        assert!(never_processed(&tonic::Status::from_error(Box::new(never_sent))));

        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!refused(&reset), "a connection that broke may have carried the call");
        assert!(refused(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert!(!never_processed(&tonic::Status::unavailable("answered by the node")));
    }
}
