//! What the client needs from the app that embeds it: its conversations,
//! its keys, a way to run background work, and a clock. Each is a small
//! trait so the client runs on any host (an SDK, a test, the example).

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::error::Error;
use crate::sender_key::RootKey;
use crate::state::ConsentState;
use crate::topic::{GroupId, Topic};

/// How a conversation takes part in the desired set (PUSH-238).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConversationKind {
    Group,
    Dm,
    /// A sync group of the inbox's own installations: desired while
    /// include_sync_groups, whatever its consent.
    Sync,
}

/// One conversation as the host knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub group_id: GroupId,
    pub kind: ConversationKind,
    /// Whether this installation is an active member.
    pub active_member: bool,
    pub consent: ConsentState,
}

/// The host's conversations. Read by the sync run outside any host
/// transaction (PUSH-240): the client never calls it from inside one.
pub trait Conversations: Send + Sync + 'static {
    fn conversations(&self) -> Result<Vec<Conversation>, Error>;
}

/// The host's keys (SYNC-015 and SYNC-022 own how they are made and shared).
pub trait Keys: Send + Sync + 'static {
    /// The inbox's 42-byte root HMAC key, once this installation has it.
    fn root_key(&self) -> Result<Option<RootKey>, Error>;
    /// This installation's welcome topic.
    fn welcome_topic(&self) -> Result<Topic, Error>;
}

pub type BackgroundTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs the client's background work (the sync loop). A host whose runner is
/// disabled cannot enable notifications (PUSH-261): nothing would keep the
/// subscriptions or the renewal going.
pub trait BackgroundRunner: Send + Sync + 'static {
    fn is_enabled(&self) -> bool;
    fn spawn(&self, task: BackgroundTask);
}

/// Runs background work on a tokio runtime.
#[derive(Clone, Debug)]
pub struct TokioRunner {
    handle: tokio::runtime::Handle,
    enabled: bool,
}

impl TokioRunner {
    /// On the current runtime. Panics outside one, as tokio does.
    pub fn current() -> TokioRunner {
        TokioRunner { handle: tokio::runtime::Handle::current(), enabled: true }
    }

    pub fn new(handle: tokio::runtime::Handle) -> TokioRunner {
        TokioRunner { handle, enabled: true }
    }

    /// A runner the host has switched off: spawns nothing.
    pub fn disabled(handle: tokio::runtime::Handle) -> TokioRunner {
        TokioRunner { handle, enabled: false }
    }
}

impl BackgroundRunner for TokioRunner {
    fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn spawn(&self, task: BackgroundTask) {
        if self.enabled {
            self.handle.spawn(task);
        }
    }
}

/// The client's clock: HMAC epochs (PUSH-258 "by its clock"), renewal and
/// the hourly run. Replaceable so a host or a test can move time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

pub(crate) fn unix_nanos(time: SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}
