//! The client side of fanout: what an app links to keep its push
//! subscriptions in step with the backend (spec 000 §8–9).
//!
//! - [`backend`]: the tonic client of `fanout.v1.NotificationService`, every
//!   request bounded to 30 s (PUSH-240).
//! - [`client`]: the notification client: enable, disable, state, overrides,
//!   effective values (PUSH-263), and the sync run with renewal, recovery
//!   and the error transitions (PUSH-260, 261, 262).
//! - [`desired`]: the desired set (PUSH-238).
//! - [`plan`]: a run's adds and removes in batches of at most 1000.
//! - [`host`]: the traits an app implements: its conversations, its keys, a
//!   background runner and a clock.
//! - [`store`]: where the local state lives ([`MemoryStore`], [`JsonFileStore`]).
//! - [`state`]: that local state: notification state, target, rules,
//!   uploaded set, overrides, renewal.
//! - [`identity`]: the random recipient id and secret (PUSH-201).
//! - [`sender_key`]: HMAC epochs, group keys, sender HMACs and key windows
//!   (PUSH-258, PUSH-229).
//! - [`publish`]: group messages with should_push (PUSH-218) and sender_hmac.
//! - [`topic`]: group ids and subscribable topics.
//! - [`push_rules`]: spec 002 §4's rule chain, validated at save and
//!   evaluated first-match on the device.
//! - [`dnd`]: spec 002 §7's do-not-disturb schedule (tzdb 2025b pinned).
//! - [`error`]: the one error type, a distinct kind per case (PUSH-251).

pub mod backend;
pub mod client;
pub mod desired;
pub mod dnd;
pub mod error;
pub mod host;
pub mod identity;
pub mod plan;
pub mod publish;
pub mod push_rules;
pub mod sender_key;
pub mod state;
pub mod store;
pub mod topic;

pub use backend::{Backend, BackendConfig, RecipientState};
pub use client::{ClientConfig, HostParts, NotificationClient, SyncReport, Trigger};
pub use error::{Error, ErrorKind};
pub use host::{
    BackgroundRunner, Clock, Conversation, ConversationKind, Conversations, Keys, SystemClock, TokioRunner,
};
pub use identity::RecipientIdentity;
pub use publish::{Outgoing, Publisher};
pub use sender_key::{GroupKey, HmacEpoch, KeyWindow, RootKey};
pub use state::{
    ConsentState, DeliveryTarget, FailureCause, NotificationState, Override, RuleOptions, Rules, StoredState,
};
pub use store::{JsonFileStore, MemoryStore, StateStore};
pub use topic::{GroupId, Topic, TopicKind};
