//! The gRPC edge: proto ⇄ engine types, and engine errors → status, once.

mod guard;
mod notification;
mod publish;
mod publish_stream;
mod status;

pub use guard::Guard;
pub use notification::NotificationApi;
pub use publish::PublishApi;
