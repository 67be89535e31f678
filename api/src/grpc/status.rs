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

/// The `method` label of each RPC `record_rpc` counts.
pub const REGISTER: &str = "Register";
pub const UNREGISTER: &str = "Unregister";
pub const UPDATE_SUBSCRIPTIONS: &str = "UpdateSubscriptions";
pub const PUBLISH: &str = "Publish";
pub const PUBLISH_STREAM: &str = "PublishStream";
pub const GET_SHARD_MAP: &str = "GetShardMap";
const METHODS: [&str; 6] = [REGISTER, UNREGISTER, UPDATE_SUBSCRIPTIONS, PUBLISH, PUBLISH_STREAM, GET_SHARD_MAP];

/// One code of each `code` label (`Unknown` for `OTHER`).
const CODES: [tonic::Code; 11] = {
    use tonic::Code::*;
    [
        Ok,
        InvalidArgument,
        NotFound,
        PermissionDenied,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        Cancelled,
        DeadlineExceeded,
        OutOfRange,
        Unknown,
    ]
};

/// Creates every method × code series at zero, so that a refusal before the
/// first scrape shows in `rate()` and `increase()`.
pub fn initialise_metrics(metrics: &Metrics) {
    for method in METHODS {
        for code in CODES {
            metrics.rpc_requests.with_label_values(&[method, code_label(code)]);
        }
    }
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
        // A message over server.grpc_max_message_bytes.
        OutOfRange => "OUT_OF_RANGE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_and_code_is_at_zero_from_the_start() {
        let metrics = Metrics::new();
        initialise_metrics(&metrics);
        let exposed = metrics.render();
        let series: Vec<&str> = exposed.lines().filter(|l| l.starts_with("fanout_rpc_requests_total{")).collect();
        assert_eq!(series.len(), 6 * 11, "{exposed}");
        for line in [
            r#"fanout_rpc_requests_total{code="OK",method="Register"} 0"#,
            r#"fanout_rpc_requests_total{code="UNAVAILABLE",method="Publish"} 0"#,
            r#"fanout_rpc_requests_total{code="OTHER",method="PublishStream"} 0"#,
        ] {
            assert!(series.contains(&line), "{line} missing:\n{exposed}");
        }
    }
}
