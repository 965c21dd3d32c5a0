//! A scratch folder for tests: created empty under the system's temporary folder, removed when dropped. A test
//! that panics keeps its folder (its path goes to stderr), so the files that show what went wrong are still there
//! to read; a passing run leaves nothing behind. Both crates' tests use it (the harness's through `kvproof_engines`).

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

/// An empty folder `kvproof-<name>` in the temporary folder, removed on drop unless the thread is panicking.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// The folder `kvproof-<name>` (callers put the process id in `name`, so test binaries run side by side do
    /// not share one), emptied if a killed run left it.
    ///
    /// # Panics
    /// When the folder cannot be created: a test cannot run without it.
    pub fn new(name: &str) -> ScratchDir {
        let path = std::env::temp_dir().join(format!("kvproof-{name}"));
        let _ = std::fs::remove_dir_all(&path);
        if let Err(e) = std::fs::create_dir_all(&path) {
            panic!("cannot create the scratch folder {}: {e}", path.display());
        }
        ScratchDir { path }
    }
}

impl Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<OsStr> for ScratchDir {
    fn as_ref(&self) -> &OsStr {
        self.path.as_os_str()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failing test's scratch folder {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passing_scope_removes_its_folder_and_a_panicking_one_keeps_it() {
        let passed = {
            let dir = ScratchDir::new(&format!("scratch-pass-{}", std::process::id()));
            std::fs::write(dir.join("f"), "x").expect("write");
            dir.to_path_buf()
        };
        assert!(!passed.exists(), "{} was left behind", passed.display());

        let name = format!("scratch-panic-{}", std::process::id());
        let kept = std::env::temp_dir().join(format!("kvproof-{name}"));
        let caught = std::panic::catch_unwind(|| {
            let dir = ScratchDir::new(&name);
            std::fs::write(dir.join("evidence"), "x").expect("write");
            panic!("a failing test");
        });
        assert!(caught.is_err());
        assert!(kept.join("evidence").exists(), "a failing test's folder was removed");
        let _ = std::fs::remove_dir_all(&kept);
    }

    #[test]
    fn a_folder_a_killed_run_left_starts_empty() {
        let name = format!("scratch-stale-{}", std::process::id());
        let stale = std::env::temp_dir().join(format!("kvproof-{name}"));
        std::fs::create_dir_all(&stale).expect("mkdir");
        std::fs::write(stale.join("old"), "x").expect("write");
        let dir = ScratchDir::new(&name);
        assert_eq!(std::fs::read_dir(&*dir).expect("read").count(), 0);
    }
}
