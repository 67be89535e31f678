use fanout_engine::metrics::Metrics;
use fanout_engine::registry::AdmissionError;
use fanout_engine::store::StoreError;
use tonic::Status;

/// The one mapping from admission errors to gRPC statuses (PUSH-253 table).
/// Messages name the rule only, never a value (PUSH-254).
pub fn admission_status(e: AdmissionError) -> Status {
    match e {
        AdmissionError::InvalidArgument(msg) => Status::invalid_argument(msg),
        AdmissionError::InvalidField(e) => Status::invalid_argument(e.rule),
        AdmissionError::NotFound => Status::not_found("recipient not found"),
        AdmissionError::PermissionDenied => Status::permission_denied("recipient secret does not match"),
        AdmissionError::FailedPrecondition(msg) => Status::failed_precondition(msg),
        AdmissionError::ResourceExhausted => Status::resource_exhausted("the request would exceed max_push_topics"),
        AdmissionError::Unavailable(e) => store_status(e),
        AdmissionError::TryAgain(why) => Status::unavailable(why),
    }
}

pub fn store_status(e: StoreError) -> Status {
    tracing::error!(error = %e, "storage error");
    Status::unavailable("storage unavailable")
}

/// Counts one RPC by method and status code, and logs a refusal. The span set
/// in main.rs adds the request id; a status message names a rule only.
pub fn record_rpc<T>(metrics: &Metrics, method: &'static str, result: &Result<T, Status>) {
    let code = match result {
        Ok(_) => "OK",
        Err(status) => code_label(status.code()),
    };
    metrics.rpc_requests.with_label_values(&[method, code]).inc();
    match result {
        Ok(_) => tracing::debug!(method, code, "rpc"),
        Err(status) => tracing::info!(method, code, reason = status.message(), "rpc refused"),
    }
}

fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        InvalidArgument => "INVALID_ARGUMENT",
        NotFound => "NOT_FOUND",
        PermissionDenied => "PERMISSION_DENIED",
        FailedPrecondition => "FAILED_PRECONDITION",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        Unavailable => "UNAVAILABLE",
        Cancelled => "CANCELLED",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        // Issue 11: a message over server.grpc_max_message_bytes.
        OutOfRange => "OUT_OF_RANGE",
        _ => "OTHER",
    }
}
