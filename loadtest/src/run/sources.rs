//! Whether a build is older than its sources: the harness warns before it
//! measures a stale engine, and rebuilds the Pushy peer when its Java changed.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// When `path` was last modified, if it exists.
pub fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A file under `roots` (files, or directories walked to the bottom) that
/// `is_source` accepts and that changed after `built`, if any.
pub fn newer_than(built: SystemTime, roots: &[PathBuf], is_source: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let mut paths = roots.to_vec();
    while let Some(path) = paths.pop() {
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_dir() {
            paths.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|e| e.path()));
        } else if is_source(&path) && meta.modified().is_ok_and(|m| m > built) {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn finds_a_newer_source_under_files_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (file, nested) = (dir.path().join("pom.xml"), dir.path().join("src/a/B.java"));
        std::fs::create_dir_all(nested.parent().unwrap()).unwrap();
        let now = SystemTime::now();
        for path in [&file, &nested] {
            std::fs::write(path, "").unwrap();
            std::fs::File::options().write(true).open(path).unwrap().set_modified(now).unwrap();
        }
        let roots = [file.clone(), dir.path().join("src"), dir.path().join("missing")];
        let before = now - Duration::from_secs(10);
        assert_eq!(newer_than(now, &roots, |_| true), None, "not newer: built at the same time");
        assert!(newer_than(before, &roots, |_| true).is_some());
        assert_eq!(newer_than(before, &roots, |p| p.extension().is_some_and(|e| e == "java")), Some(nested));
        assert_eq!(newer_than(before, &roots[..1], |_| true), Some(file));
    }
}
