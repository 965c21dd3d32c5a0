//! Files inside a folder kvproof owns, written and read without going through a link someone else planted there:
//! a new file is created exclusively (an existing file or link at the name is an error, never written through), a
//! replaced file goes through a fresh temporary file renamed over the name (a rename replaces a link, it does not
//! follow it), and a read refuses links and files larger than a bound.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::ReportError;

/// Temporary files are named `.<name>.<pid>-<n>.tmp` beside the file they replace.
const TEMP_SUFFIX: &str = ".tmp";

fn io(path: &Path) -> impl Fn(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io { path: path.to_path_buf(), source }
}

fn link_refused(path: &Path) -> ReportError {
    ReportError::Invalid {
        path: path.to_path_buf(),
        message: "is a symbolic link; kvproof does not follow links inside a run folder".into(),
    }
}

/// Whether `name` is one of the temporary files [`replace`] writes (left behind only by a killed process).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TEMP_SUFFIX)
}

/// Create `path`, which must not exist yet (not even as a link).
pub fn create_new(path: &Path) -> Result<File, ReportError> {
    // O_CREAT|O_EXCL: fails on an existing name, and a link counts as existing whatever it points to.
    OpenOptions::new().write(true).create_new(true).open(path).map_err(io(path))
}

/// Write `bytes` as `path`, replacing a file of that name (or a link, which is replaced, not written through).
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (tmp, mut file) = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_file_name(format!(".{name}.{}-{n}{TEMP_SUFFIX}", std::process::id()));
        match create_new(&tmp) {
            Ok(f) => break (tmp, f),
            // A name taken by a leftover or a planted link: take the next one rather than touch it.
            Err(ReportError::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(e),
        }
    };
    let written = std::io::Write::write_all(&mut file, bytes);
    drop(file);
    if let Err(e) = written.map_err(io(&tmp)).and_then(|()| std::fs::rename(&tmp, path).map_err(io(path))) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Make sure `dir` is a real folder (created when missing); a link or a file there is an error.
pub fn ensure_dir(dir: &Path) -> Result<(), ReportError> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => Err(link_refused(dir)),
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ReportError::Invalid { path: dir.to_path_buf(), message: "is a file, not a folder".into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(dir).map_err(io(dir)),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Open `path` for reading; a link is refused.
pub fn open_regular(path: &Path) -> Result<File, ReportError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    if meta.file_type().is_symlink() {
        return Err(link_refused(path));
    }
    File::open(path).map_err(io(path))
}

/// Read `path` whole when it is a regular file of at most `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ReportError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    // Read one byte past the bound instead of trusting the size the metadata claims.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(io(path))?;
    if bytes.len() as u64 > max {
        return Err(ReportError::Invalid {
            path: path.to_path_buf(),
            message: format!("is larger than {} MiB, more than any run writes", max >> 20),
        });
    }
    Ok(bytes)
}

/// `rel` (a path read from a run's own files) resolved inside `dir`: it must be relative, made of plain names
/// only (no `..`, no root), and no part of it that exists may be a link. `Err` says which rule it breaks.
pub fn resolve_inside(dir: &Path, rel: &str) -> Result<PathBuf, String> {
    if rel.is_empty() {
        return Err("is empty".into());
    }
    let mut path = dir.to_path_buf();
    for part in Path::new(rel).components() {
        match part {
            std::path::Component::Normal(name) => path.push(name),
            std::path::Component::CurDir => {}
            _ => return Err(format!("`{}` is not a plain relative path inside the run folder", shorten(rel))),
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!("`{}` goes through a symbolic link ({})", shorten(rel), path.display()))
            }
            Ok(_) => {}
            // The rest does not exist: nothing there to follow.
            Err(_) => break,
        }
    }
    Ok(dir.join(rel))
}

/// A value quoted in an error, cut to a readable length.
fn shorten(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvproof_engines::scratch_dir::ScratchDir;

    fn tmp(name: &str) -> ScratchDir {
        ScratchDir::new(&format!("safe-file-{}-{name}", std::process::id()))
    }

    #[test]
    fn links_are_replaced_or_refused_never_followed() {
        let dir = tmp("links");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        std::os::unix::fs::symlink(&victim, dir.join("a")).expect("link");
        assert!(create_new(&dir.join("a")).is_err());
        assert!(open_regular(&dir.join("a")).is_err());
        assert!(ensure_dir(&dir.join("a")).is_err());
        replace(&dir.join("a"), b"new").expect("replace");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "precious");
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "new");
        assert!(!std::fs::symlink_metadata(dir.join("a")).expect("a").file_type().is_symlink());
    }

    #[test]
    fn paths_from_files_stay_inside() {
        let dir = tmp("inside");
        std::fs::create_dir(dir.join("p")).expect("p");
        std::os::unix::fs::symlink("/tmp", dir.join("p/l")).expect("link");
        assert_eq!(resolve_inside(&dir, "p/x/y"), Ok(dir.join("p/x/y")));
        for bad in ["", "../x", "/etc", "p/../../x", "p/l/x"] {
            assert!(resolve_inside(&dir, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tmp("bounded");
        std::fs::write(dir.join("f"), vec![b' '; 100]).expect("f");
        assert_eq!(read_bounded(&dir.join("f"), 100).expect("fits").len(), 100);
        assert!(read_bounded(&dir.join("f"), 99).is_err());
    }
}
