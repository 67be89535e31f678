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

/// Whether a failed call was surely never processed by the node it went
/// to, so that sending it again, to that node or another, cannot store it
/// twice: its connection was refused, or the node's GOAWAY refused its
/// stream. The status of a call a node answered carries no transport error
/// as its source.
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
/// refused at connect, or a stream the node's GOAWAY refused (above its last
/// stream id: never processed, RFC 9113 section 6.8).
pub fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    error.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        || error.downcast_ref::<h2::Error>().is_some_and(|e| e.is_go_away() && e.is_remote())
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
}
