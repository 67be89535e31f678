//! What the root supervisor (`supervisor`) is told, by the engine, by
//! ingest (shards to wake) and by the lease actor (shards won and lost).

use ractor::{ActorCell, RpcReplyPort};

use crate::domain::ShardId;

pub enum SupervisorMsg {
    /// These shards stored new envelopes.
    Wake(Vec<ShardId>),
    /// Let every shard finish its current window and stop; then stop.
    Drain,
    /// The lease actor acquired this shard: start its actor.
    Own(ShardId),
    /// The lease actor gave this shard up or lost it: stop supervising its
    /// actor, ask it to release the shard (`drain`: stop at its pages in
    /// flight; else it is left to be killed), and hand it back.
    Disown { shard: ShardId, drain: bool, reply: RpcReplyPort<Option<ActorCell>> },
    /// Stop restarting children, then stop them and this actor.
    Shutdown,
    /// A graceful stop's first step: the lease actor hands every shard over
    /// (drained, leases released) and takes none again; answered once done,
    /// at once without leases.
    Leave(RpcReplyPort<()>),
}
