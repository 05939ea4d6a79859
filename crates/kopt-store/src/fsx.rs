//! File-system steps that a crash cannot leave half done.
//!
//! A folder is written under a hidden temporary name next to its final place, every file
//! and the folder synced, then renamed into place: readers see no folder or a complete
//! one. A folder is removed by renaming it to a hidden name first. Hidden leftovers of a
//! crash (`.NAME.kopt-tmp-PID-N`, `.NAME.kopt-trash-PID-N`) are ignored by every reader
//! and removed by [`clean_leftovers`] once their process is gone.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::{io, Error, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Temporary folders this process is writing right now, which [`clean_leftovers`] must
/// not take for a crash's.
static IN_PROGRESS: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

fn in_progress(path: &Path, add: bool) {
    let mut set = IN_PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    let set = set.get_or_insert_with(HashSet::new);
    if add {
        set.insert(path.to_path_buf());
    } else {
        set.remove(path);
    }
}

/// A hidden sibling of `path`: `.NAME.kopt-KIND-PID-N`.
pub(crate) fn hidden_sibling(path: &Path, kind: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.kopt-{kind}-{}-{n}", std::process::id()))
}

/// Writes a file and syncs it (not atomic by itself: used inside a temporary folder).
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// Syncs a folder, so that renames inside it survive a power cut. Best effort where the
/// platform cannot open folders.
pub(crate) fn sync_dir(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.sync_all();
    }
}

/// The files of a folder to write, by name.
pub(crate) type Files<'a> = [(&'a str, &'a [u8])];

/// Writes `files` into a new hidden folder next to `dest` and syncs them. The caller
/// renames it into place with [`publish`] (or leaves it, to simulate a crash in tests).
pub(crate) fn write_temp_dir(dest: &Path, files: &Files) -> Result<PathBuf> {
    fill_temp_dir(dest, |tmp| {
        std::fs::create_dir(tmp).map_err(io(tmp))?;
        for (name, bytes) in files {
            write_synced(&tmp.join(name), bytes)?;
        }
        sync_dir(tmp);
        Ok(())
    })
}

/// A hidden folder next to `dest` (created by `fill`, which is given its path), removed
/// again when `fill` fails.
fn fill_temp_dir(dest: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let parent = dest
        .parent()
        .ok_or_else(|| Error::Invalid(format!("{} has no parent folder", dest.display())))?;
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = hidden_sibling(dest, "tmp");
    in_progress(&tmp, true);
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        in_progress(&tmp, false);
        return Err(e);
    }
    Ok(tmp)
}

/// Renames a folder made by [`write_temp_dir`] to `dest`, which must not exist.
pub(crate) fn publish(tmp: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        let _ = std::fs::remove_dir_all(tmp);
        in_progress(tmp, false);
        return Err(Error::Conflict(format!(
            "{} appeared while it was being written; nothing was changed",
            dest.display()
        )));
    }
    let r = std::fs::rename(tmp, dest).map_err(io(dest));
    in_progress(tmp, false);
    if r.is_err() {
        let _ = std::fs::remove_dir_all(tmp);
    }
    r?;
    if let Some(p) = dest.parent() {
        sync_dir(p);
    }
    Ok(())
}

/// Forgets a temporary folder without publishing it, as a crash would (tests only).
pub(crate) fn abandon(tmp: &Path) {
    in_progress(tmp, false);
}

/// Writes a folder atomically: `dest` must not exist; afterwards it exists complete.
pub(crate) fn write_dir_atomic(dest: &Path, files: &Files) -> Result<()> {
    let tmp = write_temp_dir(dest, files)?;
    publish(&tmp, dest)
}

/// Copies the folder `from` (recursively) to `dest`, which must not exist: complete or
/// not at all.
pub(crate) fn copy_dir_atomic(from: &Path, dest: &Path) -> Result<()> {
    fn copy(from: &Path, to: &Path) -> Result<()> {
        std::fs::create_dir(to).map_err(io(to))?;
        for e in std::fs::read_dir(from).map_err(io(from))? {
            let e = e.map_err(io(from))?;
            let (src, dst) = (e.path(), to.join(e.file_name()));
            if src.is_dir() {
                copy(&src, &dst)?;
            } else {
                std::fs::copy(&src, &dst).map_err(io(&src))?;
            }
        }
        sync_dir(to);
        Ok(())
    }
    let tmp = fill_temp_dir(dest, |tmp| copy(from, tmp))?;
    publish(&tmp, dest)
}

/// Moves a folder to `to` (creating `to`'s parents); one rename, so atomic on one file
/// system.
pub(crate) fn move_dir(from: &Path, to: &Path) -> Result<()> {
    if let Some(p) = to.parent() {
        std::fs::create_dir_all(p).map_err(io(p))?;
    }
    std::fs::rename(from, to).map_err(io(from))?;
    for p in [from.parent(), to.parent()].into_iter().flatten() {
        sync_dir(p);
    }
    Ok(())
}

/// `base`, or `base.2`, `base.3`, ... : the first that does not exist.
pub(crate) fn unused_path(base: &Path) -> PathBuf {
    if !base.exists() {
        return base.to_path_buf();
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (2..)
        .map(|i| base.with_file_name(format!("{name}.{i}")))
        .find(|p| !p.exists())
        .expect("an unused name exists")
}

/// Removes a folder: renamed to a hidden name first, so that no reader ever sees it half
/// deleted.
pub(crate) fn remove_dir_atomic(dir: &Path) -> Result<()> {
    let trash = hidden_sibling(dir, "trash");
    std::fs::rename(dir, &trash).map_err(io(dir))?;
    if let Some(p) = dir.parent() {
        sync_dir(p);
    }
    let _ = std::fs::remove_dir_all(&trash);
    Ok(())
}

/// Whether the process that made a hidden leftover is gone (so the leftover is litter).
fn owner_is_gone(name: &str, path: &Path) -> bool {
    // `.NAME.kopt-KIND-PID-N`
    let mut parts = name.rsplitn(3, '-');
    let (_n, pid) = (parts.next(), parts.next());
    let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    if pid == std::process::id() {
        let set = IN_PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
        return !set.as_ref().is_some_and(|s| s.contains(path));
    }
    if cfg!(target_os = "linux") {
        !Path::new("/proc").join(pid.to_string()).exists()
    } else {
        // Without a process table to ask, wait until it is clearly abandoned.
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600)
    }
}

/// Removes the hidden leftovers of crashed writes directly inside `dir`; returns them.
pub(crate) fn clean_leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') || !(name.contains(".kopt-tmp-") || name.contains(".kopt-trash-"))
        {
            continue;
        }
        let path = e.path();
        if owner_is_gone(&name, &path) {
            let r = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if r.is_ok() {
                removed.push(path);
            }
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_appears_complete_or_not_at_all() {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("k/v");
        let tmp = write_temp_dir(&dest, &[("a", b"1"), ("b", b"2")]).unwrap();
        assert!(!dest.exists());
        assert_eq!(std::fs::read(tmp.join("b")).unwrap(), b"2");
        // A live write in this process is not litter.
        assert!(clean_leftovers(&d.path().join("k")).is_empty());
        publish(&tmp, &dest).unwrap();
        assert_eq!(std::fs::read(dest.join("a")).unwrap(), b"1");
        assert!(
            write_dir_atomic(&dest, &[("a", b"x")]).is_err(),
            "never overwrites"
        );
        assert_eq!(std::fs::read(dest.join("a")).unwrap(), b"1");

        // An abandoned write (a crash) is litter, and only hidden kopt names are touched.
        let tmp = write_temp_dir(&d.path().join("k/w"), &[("a", b"1")]).unwrap();
        abandon(&tmp);
        std::fs::create_dir(d.path().join("k/.keep")).unwrap();
        assert_eq!(clean_leftovers(&d.path().join("k")), vec![tmp]);
        assert!(d.path().join("k/.keep").exists() && dest.exists());

        remove_dir_atomic(&dest).unwrap();
        assert!(!dest.exists());
        let names: Vec<_> = std::fs::read_dir(d.path().join("k")).unwrap().collect();
        assert_eq!(names.len(), 1, "only .keep is left");
    }

    #[test]
    fn unused_paths_count_up() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("x");
        assert_eq!(unused_path(&base), base);
        std::fs::create_dir(&base).unwrap();
        assert_eq!(unused_path(&base), d.path().join("x.2"));
    }
}
