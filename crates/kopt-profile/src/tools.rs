//! Finding CUDA's command-line tools (`ncu`, `cuobjdump`, `nvdisasm`) without running
//! anything: an explicit path, else `PATH`, else CUDA's usual folders.

use std::path::{Path, PathBuf};

/// Where `name` is looked for, in order: `PATH`, `$CUDA_HOME/bin`, `$CUDA_PATH/bin`,
/// `/usr/local/cuda/bin`, and for `ncu` also `/opt/nvidia/nsight-compute/<version>/`
/// (newest first) and `/usr/local/cuda/nsight-compute-<version>/`.
pub fn search_dirs(name: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(v).join("bin"));
        }
    }
    dirs.push("/usr/local/cuda/bin".into());
    if name == "ncu" {
        for (parent, prefix) in [
            ("/opt/nvidia/nsight-compute", ""),
            ("/usr/local/cuda", "nsight-compute"),
        ] {
            let mut found: Vec<PathBuf> = std::fs::read_dir(parent)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                })
                .collect();
            found.sort();
            found.reverse();
            dirs.extend(found);
        }
    }
    dirs
}

/// A short description of [`search_dirs`], for messages.
pub fn searched(name: &str) -> String {
    let mut s = "PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin".to_string();
    if name == "ncu" {
        s.push_str(", /opt/nvidia/nsight-compute/*/");
    }
    s
}

/// The tool: `explicit` when given (it must exist), else the first executable file named
/// `name` in [`search_dirs`]. The error says where it looked and how to point at it.
pub fn find(name: &str, explicit: Option<&Path>, flag: &str) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if is_executable(p) {
            Ok(p.to_path_buf())
        } else if p.exists() {
            Err(format!(
                "{} is not an executable file ({flag})",
                p.display()
            ))
        } else {
            Err(format!("{} does not exist ({flag})", p.display()))
        };
    }
    search_dirs(name)
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            format!(
                "`{name}` not found (looked in {}): install it, or give its path with {flag}",
                searched(name)
            )
        })
}

fn is_executable(p: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(p) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_must_exist() {
        let e = find("ncu", Some(Path::new("/nowhere/ncu")), "--ncu PATH").unwrap_err();
        assert_eq!(e, "/nowhere/ncu does not exist (--ncu PATH)");
        let dir = std::env::temp_dir();
        let e = find("ncu", Some(&dir), "--ncu PATH").unwrap_err();
        assert!(e.contains("is not an executable file"), "{e}");
        assert!(searched("ncu").contains("nsight-compute"));
    }
}
