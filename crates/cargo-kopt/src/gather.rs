//! Gathering the annotated kernels of a workspace: `cargo metadata --no-deps` for the
//! packages, `syn` for their sources, and `kopt_spec`'s parser (the macro's own) for each
//! `#[kopt::kernel]`.

use std::path::{Path, PathBuf};

use kopt_spec::source::{self, Amalgamated};
use kopt_spec::spec::{self, KernelSpec};
use kopt_spec::store::{self, Hashes, KernelState};

/// Which packages to look at, as cargo's `-p`, `--workspace` and `--exclude` say.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub manifest_path: Option<PathBuf>,
    pub packages: Vec<String>,
    pub exclude: Vec<String>,
}

/// One annotated kernel with its committed files resolved.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    pub crate_root: PathBuf,
    /// The source file of the annotation, relative to the crate root, and its line.
    pub file: String,
    pub line: usize,
    pub spec: KernelSpec,
    pub reference: Amalgamated,
    pub hashes: Hashes,
    pub state: KernelState,
}

/// An annotation that does not parse: the build reports it as a compile error too.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AnnotationError {
    pub package: String,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct Package {
    pub name: String,
    pub root: PathBuf,
}

#[derive(Debug, Default)]
pub struct Gathered {
    pub kernels: Vec<Kernel>,
    pub errors: Vec<AnnotationError>,
    /// The packages that were searched (those depending on kopt).
    pub packages: Vec<Package>,
    /// The workspace's root, as `cargo metadata` reports it.
    pub workspace_root: PathBuf,
    pub target_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("`cargo metadata` failed: {0}")]
    Metadata(String),
    #[error("package `{0}` is not a member of this workspace")]
    UnknownPackage(String),
}

/// The names under which a crate can depend on kopt.
const KOPT_CRATES: &[&str] = &["kopt-runtime", "kopt"];

pub fn gather(sel: &Selection) -> Result<Gathered, GatherError> {
    let mut cmd = cargo_metadata::MetadataCommand::new();
    cmd.no_deps();
    if let Some(p) = &sel.manifest_path {
        cmd.manifest_path(p);
    }
    let meta = cmd
        .exec()
        .map_err(|e| GatherError::Metadata(e.to_string()))?;
    let members: Vec<&cargo_metadata::Package> = meta.workspace_packages();
    for p in &sel.packages {
        if !members.iter().any(|m| m.name.as_str() == p) {
            return Err(GatherError::UnknownPackage(p.clone()));
        }
    }
    let mut out = Gathered {
        workspace_root: meta.workspace_root.as_std_path().to_path_buf(),
        target_dir: meta.target_directory.as_std_path().to_path_buf(),
        ..Gathered::default()
    };
    let mut selected: Vec<&cargo_metadata::Package> = members
        .into_iter()
        .filter(|p| sel.packages.is_empty() || sel.packages.iter().any(|s| s == p.name.as_str()))
        .filter(|p| !sel.exclude.iter().any(|s| s == p.name.as_str()))
        .filter(|p| {
            // A dev-dependency on kopt (test helpers, trybuild cases of invalid
            // annotations) does not make a crate's kernels part of the workspace's.
            p.dependencies.iter().any(|d| {
                KOPT_CRATES.contains(&d.name.as_str())
                    && d.kind != cargo_metadata::DependencyKind::Development
            })
        })
        .collect();
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    for pkg in selected {
        let root = pkg
            .manifest_path
            .parent()
            .map(|p| p.as_std_path().to_path_buf())
            .unwrap_or_default();
        gather_package(pkg.name.as_str(), &root, &pkg.targets, &mut out);
        out.packages.push(Package {
            name: pkg.name.to_string(),
            root,
        });
    }
    Ok(out)
}

/// Gathers one crate from its folder (its `src/`), without `cargo metadata`: for machines
/// that have the sources but no cargo (a GPU runner), and for tests.
pub fn gather_crate(package: &str, root: &Path, target_dir: &Path) -> Gathered {
    let mut out = Gathered {
        target_dir: target_dir.to_path_buf(),
        ..Gathered::default()
    };
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    for file in files {
        gather_file(package, root, &file, &mut out);
    }
    out.packages.push(Package {
        name: package.to_string(),
        root: root.to_path_buf(),
    });
    out
}

fn gather_package(name: &str, root: &Path, targets: &[cargo_metadata::Target], out: &mut Gathered) {
    let mut dirs: Vec<PathBuf> = targets
        .iter()
        .filter_map(|t| t.src_path.parent().map(|p| p.as_std_path().to_path_buf()))
        .collect();
    dirs.sort();
    dirs.dedup();
    // Keep outermost folders only, so no file is read twice.
    let roots: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| !dirs.iter().any(|o| o != *d && d.starts_with(o)))
        .cloned()
        .collect();
    let mut files = Vec::new();
    for d in &roots {
        rust_files(d, &mut files);
    }
    files.sort();
    for file in files {
        gather_file(name, root, &file, out);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

pub(crate) fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn gather_file(package: &str, root: &Path, file: &Path, out: &mut Gathered) {
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    if !text.contains("kernel") {
        return;
    }
    let relf = rel(root, file);
    let err = |span: proc_macro2::Span, message: String| AnnotationError {
        package: package.to_string(),
        file: relf.clone(),
        line: span.start().line,
        column: span.start().column + 1,
        message,
    };
    let parsed = match syn::parse_file(&text) {
        Ok(f) => f,
        // rustc reports syntax errors better than we could.
        Err(_) => return,
    };
    let mut items = Vec::new();
    collect_items(&parsed.items, &mut items);
    for item in items {
        let Ok(func) = spec::parse_item(item) else {
            continue;
        };
        let Some(attr) = func.attrs.iter().find(|a| is_kopt_kernel(a.path())) else {
            continue;
        };
        let args = match &attr.meta {
            syn::Meta::List(l) => l.tokens.clone(),
            _ => proc_macro2::TokenStream::new(),
        };
        let line = func.sig.ident.span().start().line;
        let (spec, launcher) = match spec::parse_kernel(args, &func) {
            Ok(x) => x,
            Err(e) => {
                out.errors.push(err(e.span(), e.to_string()));
                continue;
            }
        };
        let reference = match source::amalgamate(root, &spec.reference, &spec.include) {
            Ok(r) => r,
            Err(e) => {
                out.errors.push(err(launcher.reference_span, e.to_string()));
                continue;
            }
        };
        if !source::defines_entry(&reference.text, &spec.entry) {
            out.errors.push(err(
                launcher.entry_span,
                format!(
                    "`{}` defines no `__global__` function `{}`",
                    spec.reference, spec.entry
                ),
            ));
            continue;
        }
        let hashes = Hashes::of(&spec, &reference);
        let state = store::resolve(root, &spec, &hashes);
        out.kernels.push(Kernel {
            package: package.to_string(),
            crate_root: root.to_path_buf(),
            file: relf.clone(),
            line,
            spec,
            reference,
            hashes,
            state,
        });
    }
}

/// `#[kopt::kernel]` (the documented spelling).
fn is_kopt_kernel(path: &syn::Path) -> bool {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segs == ["kopt", "kernel"]
}

/// Items of a file, descending into inline modules. Bodiless functions come as verbatim
/// tokens, which `spec::parse_item` understands.
fn collect_items(items: &[syn::Item], out: &mut Vec<proc_macro2::TokenStream>) {
    use quote::ToTokens;
    for item in items {
        match item {
            syn::Item::Fn(f) => out.push(f.to_token_stream()),
            syn::Item::Verbatim(ts) => out.push(ts.clone()),
            syn::Item::Mod(m) => {
                if let Some((_, inner)) = &m.content {
                    collect_items(inner, out);
                }
            }
            _ => {}
        }
    }
}
