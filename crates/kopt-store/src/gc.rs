//! `cargo kopt gc`: the variant folders under `kopt/<kernel>/` that no lock entry names.
//!
//! Accepting a variant keeps the folder of the one it replaces, so that `cargo kopt revert
//! --to` can bring it back; over many runs they pile up. Their history is in git, so a
//! folder nothing names can go: [`unreferenced`] lists them and [`remove`] deletes one
//! (renamed to a hidden name first, so that no reader sees half a folder).
//!
//! A folder whose `rationale.json` records no claim was never accepted by kopt (a
//! hand-made variant not yet pinned, say, which may exist nowhere else): it is listed but
//! kept.

use std::path::{Path, PathBuf};

use kopt_spec::files::{self, LockFile, Rationale};
use kopt_spec::selection::variant_folders;
use serde::Serialize;

use crate::{fsx, io, Error, Result};

/// A variant folder no lock entry names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreferenced {
    pub kernel: String,
    pub variant: String,
    /// `kopt/<kernel>/<variant>`, relative to the crate root.
    pub folder: String,
    /// Why it stays even when unreferenced folders are deleted; `None`: it may go.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
    #[serde(skip)]
    pub path: PathBuf,
}

/// The variant folders of `kernel` in the crate at `crate_root` that its lock file does not
/// name, by name. A lock file that cannot be read is an error: without it there is no
/// telling which folders are still in use, so none may be removed.
pub fn unreferenced(crate_root: &Path, kernel: &str) -> Result<Vec<Unreferenced>> {
    let kdir = files::kernel_dir(crate_root, kernel);
    let rel = |p: &Path| -> String {
        p.strip_prefix(crate_root)
            .unwrap_or(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let lock_path = kdir.join(files::LOCK_FILE);
    let lock = match std::fs::read_to_string(&lock_path) {
        Ok(text) => Some(LockFile::parse(&text).map_err(|e| {
            Error::Invalid(format!(
                "{}: {e}; without it kopt cannot tell which variant folders of `{kernel}` are in use, so it removes none: restore it first (`git checkout -- {}`)",
                rel(&lock_path),
                rel(&lock_path)
            ))
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(&lock_path)(e)),
    };
    let named: Vec<&str> = lock
        .iter()
        .flat_map(|l| l.accepted.iter().map(|e| e.variant.as_str()))
        .collect();
    Ok(variant_folders(&kdir)
        .into_iter()
        .filter(|name| !named.contains(&name.as_str()))
        .map(|name| {
            let path = kdir.join(&name);
            let kept = if !files::is_valid_variant_name(&name) {
                Some(format!(
                    "`{name}` is not a variant name, so kopt did not write it; remove it yourself if it is not needed"
                ))
            } else {
                let claimed = std::fs::read_to_string(path.join(files::RATIONALE_JSON))
                    .ok()
                    .and_then(|t| Rationale::parse(&t).ok())
                    .is_some_and(|r| r.claim.is_some());
                (!claimed).then(|| format!(
                    "its {} records no claim, so kopt never accepted it (a hand-made variant not yet pinned?) and git may not hold it; remove it yourself if it is not needed",
                    files::RATIONALE_JSON
                ))
            };
            Unreferenced {
                kernel: kernel.to_string(),
                variant: name,
                folder: rel(&path),
                kept,
                path,
            }
        })
        .collect())
}

/// Deletes an unreferenced folder that may go; refuses one that is kept, or one that the
/// lock file names by now.
pub fn remove(crate_root: &Path, folder: &Unreferenced) -> Result<()> {
    if let Some(why) = &folder.kept {
        return Err(Error::Conflict(format!("{} is kept: {why}", folder.folder)));
    }
    let still = unreferenced(crate_root, &folder.kernel)?;
    if !still.iter().any(|u| u.variant == folder.variant) {
        return Err(Error::Conflict(format!(
            "{} is named by the lock file of `{}` now (or gone); nothing was removed",
            folder.folder, folder.kernel
        )));
    }
    fsx::remove_dir_atomic(&folder.path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kopt_spec::files::{Claim, LockEntry, VerifiedBy};

    fn folder(kdir: &Path, name: &str, claim: bool) {
        let d = kdir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(files::SOURCE_FILE), "__global__ void k() {}\n").unwrap();
        let mut r = Rationale::skeleton("k", name, "sm_90");
        if claim {
            r.claim = Some(Claim {
                region: None,
                device: None,
                verified_by: VerifiedBy::Kopt,
                reference_hash: "sha256:r".into(),
                spec_hash: "sha256:s".into(),
                source_hash: None,
                variant_hash: None,
                ptx: None,
            });
        }
        std::fs::write(d.join(files::RATIONALE_JSON), r.to_json()).unwrap();
    }

    fn entry(variant: &str) -> LockEntry {
        LockEntry {
            arch: "sm_90".into(),
            device: None,
            variant: variant.into(),
            region: None,
            verified_by: VerifiedBy::Kopt,
            reference_hash: "sha256:r".into(),
            spec_hash: "sha256:s".into(),
            source_hash: "sha256:a".into(),
            variant_hash: "sha256:b".into(),
            ptx: None,
        }
    }

    #[test]
    fn lists_what_no_lock_entry_names_and_deletes_only_what_kopt_accepted() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let kdir = files::kernel_dir(root, "k");
        for (name, claim) in [("now", true), ("old", true), ("mine", false)] {
            folder(&kdir, name, claim);
        }
        // kopt's own temporary folders are not variants.
        std::fs::create_dir_all(kdir.join(".old.kopt-tmp-1-1")).unwrap();
        let mut lock = LockFile::new("k");
        lock.accepted.push(entry("now"));
        std::fs::write(kdir.join(files::LOCK_FILE), lock.render()).unwrap();

        let found = unreferenced(root, "k").unwrap();
        let names: Vec<(&str, bool)> = found
            .iter()
            .map(|u| (u.variant.as_str(), u.kept.is_none()))
            .collect();
        assert_eq!(names, [("mine", false), ("old", true)]);
        assert_eq!(found[1].folder, "kopt/k/old");
        assert!(
            found[0]
                .kept
                .as_deref()
                .unwrap()
                .contains("records no claim"),
            "{found:?}"
        );

        let err = remove(root, &found[0]).unwrap_err().to_string();
        assert!(err.contains("kopt/k/mine is kept"), "{err}");
        remove(root, &found[1]).unwrap();
        assert!(!kdir.join("old").exists());
        assert!(kdir.join("now").exists() && kdir.join("mine").exists());

        // A folder the lock names by the time it would be removed stays.
        folder(&kdir, "back", true);
        let back = unreferenced(root, "k")
            .unwrap()
            .into_iter()
            .find(|u| u.variant == "back")
            .unwrap();
        lock.accepted.push(entry("back"));
        std::fs::write(kdir.join(files::LOCK_FILE), lock.render()).unwrap();
        assert!(remove(root, &back).is_err());
        assert!(kdir.join("back").exists());
    }

    #[test]
    fn an_unreadable_lock_removes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let kdir = files::kernel_dir(d.path(), "k");
        folder(&kdir, "old", true);
        std::fs::write(kdir.join(files::LOCK_FILE), "format = 1\nkernel = 3\n").unwrap();
        let err = unreferenced(d.path(), "k").unwrap_err().to_string();
        assert!(
            err.contains("kopt/k/kopt.lock") && err.contains("removes none"),
            "{err}"
        );
        // No lock at all: nothing names any folder.
        std::fs::remove_file(kdir.join(files::LOCK_FILE)).unwrap();
        assert_eq!(unreferenced(d.path(), "k").unwrap().len(), 1);
        assert!(unreferenced(d.path(), "absent").unwrap().is_empty());
    }
}
