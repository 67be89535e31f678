//! What a store call can fail with.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("recipient not found")]
    NotFound,
    /// The stored secret hash differs from the presented one (PUSH-253 check 3).
    #[error("recipient secret does not match")]
    SecretMismatch,
    /// Applying the update would exceed max_push_topics (PUSH-217).
    #[error("subscription limit exceeded")]
    TopicLimit,
    /// The backend failed; the message never carries private values.
    #[error("storage backend error: {0}")]
    Backend(String),
}
