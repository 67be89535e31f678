//! The one error type of the client (PUSH-251): every failure an app can see
//! carries a distinct [`ErrorKind`], so an app tells a channel the deployment
//! lacks from a topic limit, a timeout, or a runner that is switched off.
//! Messages never carry a secret, a token, a URL, a key or a topic.

use serde::{Deserialize, Serialize};

/// What went wrong, one kind per case PUSH-251 names, and the local ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    // PUSH-262's terminal statuses: each sets the state to failed.
    /// PERMISSION_DENIED: the stored secret does not match the recipient.
    PermissionDenied,
    /// INVALID_ARGUMENT: the backend refused the request's shape or target.
    InvalidArgument,
    /// OUT_OF_RANGE.
    OutOfRange,
    /// UNIMPLEMENTED: the backend does not serve notifications.
    Unimplemented,
    /// FAILED_PRECONDITION on a request other than Register.
    FailedPrecondition,
    /// FAILED_PRECONDITION on Register: the deployment has no table for the
    /// channel (PUSH-210).
    ChannelNotConfigured,
    /// RESOURCE_EXHAUSTED: the recipient would hold more topics than the
    /// deployment allows (PUSH-217). Adds stop until the desired set changes.
    TopicLimit,
    /// The backend did not answer within the request bound (PUSH-240).
    Timeout,
    /// NOT_FOUND: the recipient is gone on the backend; the client registers
    /// again and re-sends every desired topic (PUSH-260).
    NotFound,
    /// Any other status or a transport failure: retried (PUSH-262).
    Unavailable,
    /// enable() while the host's background task runner is disabled (PUSH-261).
    BackgroundTasksDisabled,
    /// enable() with an HTTPS signing key outside 16..=64 bytes (PUSH-261).
    InvalidSigningKey,
    /// A request that needs notifications enabled while they are not.
    NotEnabled,
    /// The local state store failed to read or write.
    Storage,
    /// A host trait (conversations, keys) failed, or its data was malformed.
    Host,
    /// The client's own configuration is out of bounds.
    InvalidConfig,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::OutOfRange => "out_of_range",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::ChannelNotConfigured => "channel_not_configured",
            ErrorKind::TopicLimit => "topic_limit",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::BackgroundTasksDisabled => "background_tasks_disabled",
            ErrorKind::InvalidSigningKey => "invalid_signing_key",
            ErrorKind::NotEnabled => "not_enabled",
            ErrorKind::Storage => "storage",
            ErrorKind::Host => "host",
            ErrorKind::InvalidConfig => "invalid_config",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The client's error: a kind to branch on and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Which notification RPC a status answered: FAILED_PRECONDITION means an
/// unconfigured channel only on Register (PUSH-210).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    Register,
    Unregister,
    UpdateSubscriptions,
}

impl Rpc {
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Register => "Register",
            Rpc::Unregister => "Unregister",
            Rpc::UpdateSubscriptions => "UpdateSubscriptions",
        }
    }
}

/// The kind of a gRPC status answered to `rpc`. The status message is not
/// kept: the backend's text is not the app's to show, and PUSH-254 keeps
/// private values out of it anyway, so only the code is quoted.
pub fn kind_of_status(code: tonic::Code, rpc: Rpc) -> ErrorKind {
    use tonic::Code;
    match code {
        Code::PermissionDenied => ErrorKind::PermissionDenied,
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::OutOfRange => ErrorKind::OutOfRange,
        Code::Unimplemented => ErrorKind::Unimplemented,
        Code::FailedPrecondition if rpc == Rpc::Register => ErrorKind::ChannelNotConfigured,
        Code::FailedPrecondition => ErrorKind::FailedPrecondition,
        Code::ResourceExhausted => ErrorKind::TopicLimit,
        Code::NotFound => ErrorKind::NotFound,
        Code::DeadlineExceeded => ErrorKind::Timeout,
        _ => ErrorKind::Unavailable,
    }
}

pub(crate) fn status_error(status: &tonic::Status, rpc: Rpc) -> Error {
    let kind = kind_of_status(status.code(), rpc);
    Error::new(kind, format!("{} answered {:?}", rpc.name(), status.code()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn every_push_262_status_has_its_own_kind() {
        let kinds: Vec<ErrorKind> = [
            Code::PermissionDenied,
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::FailedPrecondition,
            Code::ResourceExhausted,
            Code::NotFound,
        ]
        .into_iter()
        .map(|c| kind_of_status(c, Rpc::UpdateSubscriptions))
        .collect();
        let distinct: std::collections::HashSet<_> = kinds.iter().collect();
        assert_eq!(distinct.len(), kinds.len(), "{kinds:?}");
    }

    #[test]
    fn failed_precondition_on_register_is_an_unconfigured_channel() {
        assert_eq!(kind_of_status(Code::FailedPrecondition, Rpc::Register), ErrorKind::ChannelNotConfigured);
        assert_eq!(kind_of_status(Code::FailedPrecondition, Rpc::UpdateSubscriptions), ErrorKind::FailedPrecondition);
    }

    #[test]
    fn other_statuses_are_unavailable_and_retried() {
        for code in [Code::Unavailable, Code::Internal, Code::Unknown, Code::Aborted, Code::Cancelled] {
            assert_eq!(kind_of_status(code, Rpc::Register), ErrorKind::Unavailable, "{code:?}");
        }
        assert_eq!(kind_of_status(Code::DeadlineExceeded, Rpc::Register), ErrorKind::Timeout);
    }

    #[test]
    fn the_message_names_the_rpc_and_code_only() {
        let status = tonic::Status::invalid_argument("url https://secret.example/hook is bad");
        let err = status_error(&status, Rpc::Register);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(!err.to_string().contains("secret.example"), "{err}");
        assert!(err.to_string().contains("Register"), "{err}");
    }
}
