//! Changes staged in memory between commits: the gateway's window state
//! (`GatewayStore::state`, `state_cas`), the notify claims
//! (`GatewayStore::notify_claim`) and the relay ingress's claims
//! (`RelayStore::claim`). A notify makes a claim and four compare-and-sets
//! (dedup marker, badge dwell, rate window, pending ledger) before the
//! commit of its answer, and a relayed webhook a claim before its
//! settlement; each as a write of its own waited for a turn of the writer
//! thread. Here a change is decided and applied at once, under one lock,
//! against the staged value of its key or else the stored one, and every
//! write transaction (`commit.rs`) first writes what is staged.
//!
//! That is `commit::Sync::WithNext` without the wait: a staged change is
//! seen by every later read and change at once and reaches the disk with the
//! next synced commit. Every change staged before a write is queued is
//! written in that write's transaction or an earlier one, so a crash leaves
//! every change up to some point, as with commits in order; the answer of a
//! notify, synced, carries the window state it was decided on, and a relay
//! settlement the claim it settles.
//!
//! Bounded: beyond [`MAX_STAGED`] keys a change first waits for a commit to
//! take them.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::StoreError;

/// Keys staged at most before a compare-and-set waits for a commit.
pub(super) const MAX_STAGED: usize = 4096;

/// A stored or staged state value: expires_at (ms) and the value.
pub(super) type Value = (i64, Vec<u8>);

/// A value's bytes while it has not expired at `now`.
pub(super) fn live(value: Option<&Value>, now: i64) -> Option<&[u8]> {
    value.filter(|(expires, _)| *expires > now).map(|(_, v)| v.as_slice())
}

#[derive(Default)]
pub(super) struct StagedState {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Full state key → the value and the version that staged it.
    entries: HashMap<Vec<u8>, (Value, u64)>,
    next_version: u64,
    /// A commit will take what is staged: nobody needs to ask for one.
    commit_due: bool,
}

/// Whether a staged change needs a commit asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asks {
    /// Nothing else will write it soon: ask for a commit.
    Commit,
    /// A write of the caller's own follows and carries it (its transaction
    /// writes what is staged first).
    Nothing,
}

/// What [`StagedState::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Update<R> {
    /// Staged; `ask_commit`: no commit is due yet, the caller asks for one.
    Set { ask_commit: bool, decided: R },
    /// Nothing staged.
    Kept(R),
    /// [`MAX_STAGED`] keys wait: the caller lets a commit take them first.
    Full,
}

/// What a compare-and-set did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cas {
    /// Staged; `ask_commit`: no commit is due yet, the caller asks for one.
    Set { ask_commit: bool },
    /// The live value is not the expected one: nothing changed.
    Refused,
    /// [`MAX_STAGED`] keys wait: the caller lets a commit take them first.
    Full,
}

/// What a transaction wrote: (key, version) to forget once it committed.
pub(super) type Written = Vec<(Vec<u8>, u64)>;

impl StagedState {
    /// The staged value of `key`; `None` when nothing is staged (the store
    /// has it).
    pub(super) fn get(&self, key: &[u8]) -> Option<Value> {
        self.lock().entries.get(key).map(|(value, _)| value.clone())
    }

    /// Sets `new` until `expires_at` when the live value (staged, else
    /// `stored()`'s, either only while it has not expired at `now`) is
    /// `expected`.
    pub(super) fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now: i64,
        expires_at: i64,
        stored: impl FnOnce() -> Result<Option<Value>, StoreError>,
    ) -> Result<Cas, StoreError> {
        let decide = |current: Option<&Value>| {
            let set = live(current, now) == expected;
            Ok((set.then(|| (expires_at, new.to_vec())), ()))
        };
        Ok(match self.update(key, Asks::Commit, stored, decide)? {
            Update::Set { ask_commit, .. } => Cas::Set { ask_commit },
            Update::Kept(()) => Cas::Refused,
            Update::Full => Cas::Full,
        })
    }

    /// Stages what `decide` makes of the current value of `key` (staged,
    /// else `stored()`'s, expired or not): `Some(value)` is staged, `None`
    /// changes nothing; `decide`'s answer is handed back either way.
    pub(super) fn update<R>(
        &self,
        key: &[u8],
        asks: Asks,
        stored: impl FnOnce() -> Result<Option<Value>, StoreError>,
        decide: impl FnOnce(Option<&Value>) -> Result<(Option<Value>, R), StoreError>,
    ) -> Result<Update<R>, StoreError> {
        let mut inner = self.lock();
        let current = match inner.entries.get(key) {
            Some((value, _)) => Some(value.clone()),
            None if inner.entries.len() >= MAX_STAGED => return Ok(Update::Full),
            // Read under the lock: no commit of this key can come between.
            None => stored()?,
        };
        let (value, decided) = decide(current.as_ref())?;
        let Some(value) = value else { return Ok(Update::Kept(decided)) };
        inner.next_version += 1;
        let version = inner.next_version;
        inner.entries.insert(key.to_vec(), (value, version));
        let ask_commit = asks == Asks::Commit && !std::mem::replace(&mut inner.commit_due, true);
        Ok(Update::Set { ask_commit, decided })
    }

    /// Writes everything staged with `put` (in the writer's transaction);
    /// returns what was written, for [`Self::committed`].
    pub(super) fn write(
        &self,
        mut put: impl FnMut(&[u8], &Value) -> Result<(), StoreError>,
    ) -> Result<Written, StoreError> {
        let mut inner = self.lock();
        // Changes staged from now on need another commit.
        inner.commit_due = false;
        let mut written = Vec::with_capacity(inner.entries.len());
        for (key, (value, version)) in &inner.entries {
            put(key, value)?;
            written.push((key.clone(), *version));
        }
        Ok(written)
    }

    /// Forgets what a committed transaction wrote, unless staged again since.
    pub(super) fn committed(&self, written: Written) {
        let mut inner = self.lock();
        for (key, version) in written {
            if inner.entries.get(&key).is_some_and(|(_, v)| *v == version) {
                inner.entries.remove(&key);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic under the lock leaves the map whole (each change is one
        // insert or remove): go on with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(v: Option<Value>) -> impl FnOnce() -> Result<Option<Value>, StoreError> {
        move || Ok(v)
    }

    #[test]
    fn a_change_is_seen_at_once_and_forgotten_once_committed_unless_changed_again() {
        let s = StagedState::default();
        assert_eq!(s.cas(b"k", None, b"1", 0, 100, stored(None)).unwrap(), Cas::Set { ask_commit: true });
        assert_eq!(s.get(b"k"), Some((100, b"1".to_vec())));
        // Decided against the staged value, not the store's.
        assert_eq!(s.cas(b"k", None, b"2", 0, 100, stored(None)).unwrap(), Cas::Refused);
        assert_eq!(s.cas(b"k", Some(b"1"), b"2", 0, 100, stored(None)).unwrap(), Cas::Set { ask_commit: false });

        let mut put = Vec::new();
        let written = s
            .write(|k, v| {
                put.push((k.to_vec(), v.clone()));
                Ok(())
            })
            .unwrap();
        assert_eq!(put, vec![(b"k".to_vec(), (100, b"2".to_vec()))]);
        // Staged again while that transaction commits: kept, and a commit asked for.
        assert_eq!(s.cas(b"k", Some(b"2"), b"3", 0, 100, stored(None)).unwrap(), Cas::Set { ask_commit: true });
        s.committed(written);
        assert_eq!(s.get(b"k"), Some((100, b"3".to_vec())));
        let written = s.write(|_, _| Ok(())).unwrap();
        s.committed(written);
        assert_eq!(s.get(b"k"), None, "the store has it now");
    }

    #[test]
    fn an_expired_value_counts_as_absent_and_the_bound_holds() {
        let s = StagedState::default();
        assert_eq!(
            s.cas(b"k", None, b"1", 50, 60, stored(Some((40, b"old".to_vec())))).unwrap(),
            Cas::Set { ask_commit: true }
        );
        assert_eq!(s.cas(b"k", None, b"2", 70, 80, stored(None)).unwrap(), Cas::Set { ask_commit: false });
        for i in 1..MAX_STAGED {
            s.cas(format!("k{i}").as_bytes(), None, b"v", 0, 1, stored(None)).unwrap();
        }
        assert_eq!(s.cas(b"one more", None, b"v", 0, 1, stored(None)).unwrap(), Cas::Full);
        // A staged key can still change.
        assert_eq!(s.cas(b"k", Some(b"2"), b"3", 70, 80, stored(None)).unwrap(), Cas::Set { ask_commit: false });
    }
}
