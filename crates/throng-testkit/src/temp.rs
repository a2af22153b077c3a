//! Scratch directories: one per use, unique within the run, removed when
//! dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory under the system's temporary directory.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// `throng-test-<name>-<pid>-<n>`: tests running at the same time in one
    /// process, or in several, never share one.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("throng-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory (not created).
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// [`Self::file`] as a string, for a command line.
    pub fn arg(&self, name: &str) -> String {
        self.file(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_is_new_and_goes_when_dropped() {
        let (a, b) = (TempDir::new("same"), TempDir::new("same"));
        assert_ne!(a.path(), b.path());
        std::fs::write(a.file("x"), "x").unwrap();
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists());
        assert!(b.path().is_dir());
    }
}
