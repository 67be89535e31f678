//! Where the client keeps its [`StoredState`]: a host trait, and two stores
//! a host can use without code of its own (in memory, and a JSON file).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, ErrorKind};
use crate::state::StoredState;

/// The host's local state storage. `save` must be durable when it returns:
/// the client writes before it sends (the uploaded set's pending marks) and
/// after each answer.
pub trait StateStore: Send + Sync + 'static {
    /// The saved state, or `None` before the first save.
    fn load(&self) -> Result<Option<StoredState>, Error>;
    fn save(&self, state: &StoredState) -> Result<(), Error>;
}

/// Keeps the state in memory: for tests and for hosts that persist nothing.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<Option<StoredState>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl StateStore for MemoryStore {
    fn load(&self) -> Result<Option<StoredState>, Error> {
        Ok(self.state.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn save(&self, state: &StoredState) -> Result<(), Error> {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(state.clone());
        Ok(())
    }
}

/// One JSON file, replaced atomically on every save (written beside it,
/// synced, then renamed over it), so a crash leaves the old or the new state
/// and never half of one. The file holds the recipient secret: it is created
/// readable by its owner only.
#[derive(Debug)]
pub struct JsonFileStore {
    path: PathBuf,
    // One save at a time: two writers must not share the temporary file.
    write: Mutex<()>,
}

impl JsonFileStore {
    pub fn new(path: impl Into<PathBuf>) -> JsonFileStore {
        JsonFileStore { path: path.into(), write: Mutex::new(()) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn storage(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Storage, format!("{what}: {e}"))
}

impl StateStore for JsonFileStore {
    fn load(&self) -> Result<Option<StoredState>, Error> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| storage("the state file is corrupt", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(storage("reading the state file", e)),
        }
    }

    fn save(&self, state: &StoredState) -> Result<(), Error> {
        use std::io::Write as _;
        let _one_writer = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = serde_json::to_vec(state).map_err(|e| storage("encoding the state", e))?;
        let mut temp = self.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temp).map_err(|e| storage("creating the state file", e))?;
        file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(|e| storage("writing the state file", e))?;
        std::fs::rename(&temp, &self.path).map_err(|e| storage("replacing the state file", e))?;
        // The rename is durable only once the directory is.
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| storage("syncing the state directory", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::RecipientIdentity;
    use crate::state::NotificationState;

    fn sample() -> StoredState {
        StoredState {
            identity: Some(RecipientIdentity::from_parts([1; 32], [2; 32])),
            state: NotificationState::Enabled,
            ..StoredState::default()
        }
    }

    #[test]
    fn the_memory_store_returns_what_was_saved() {
        let store = MemoryStore::new();
        assert_eq!(store.load().unwrap(), None);
        store.save(&sample()).unwrap();
        assert_eq!(store.load().unwrap(), Some(sample()));
    }

    #[test]
    fn the_file_store_survives_a_new_instance_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notifications.json");
        let store = JsonFileStore::new(&path);
        assert_eq!(store.load().unwrap(), None);
        store.save(&sample()).unwrap();
        let mut changed = sample();
        changed.state = NotificationState::Disabled;
        store.save(&changed).unwrap();
        assert_eq!(JsonFileStore::new(&path).load().unwrap(), Some(changed));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert!(!dir.path().join("notifications.json.tmp").exists());
    }

    #[test]
    fn a_corrupt_file_is_a_storage_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(JsonFileStore::new(&path).load().unwrap_err().kind(), ErrorKind::Storage);
    }
}
