use fanout_engine::registry::AdmissionError;
use fanout_engine::store::StoreError;
use tonic::Status;

/// The one mapping from admission errors to gRPC statuses (PUSH-253 table).
/// Messages name the rule only, never a value (PUSH-254).
pub fn admission_status(e: AdmissionError) -> Status {
    match e {
        AdmissionError::InvalidArgument(msg) => Status::invalid_argument(msg),
        AdmissionError::NotFound => Status::not_found("recipient not found"),
        AdmissionError::PermissionDenied => Status::permission_denied("recipient secret does not match"),
        AdmissionError::FailedPrecondition(msg) => Status::failed_precondition(msg),
        AdmissionError::ResourceExhausted => {
            Status::resource_exhausted("the request would exceed max_push_topics")
        }
        AdmissionError::Unavailable(e) => store_status(e),
    }
}

pub fn store_status(e: StoreError) -> Status {
    tracing::error!(error = %e, "storage error");
    Status::unavailable("storage unavailable")
}
