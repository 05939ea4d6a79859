//! Gathering the annotated kernels of a workspace: `cargo metadata --no-deps` for the
//! packages, `syn` for their sources, and `kopt_spec`'s parser (the macro's own) for each
//! `#[kopt::kernel]` (or the name a `use kopt::kernel` gives it in the same module).

use std::path::{Path, PathBuf};

use kopt_spec::selection::{self, Hashes, KernelState};
use kopt_spec::source::{self, Amalgamated};
use kopt_spec::spec::{self, KernelSpec};

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
    /// What a lexical reading could not settle and NVRTC will (an entry made by a macro,
    /// a quoted include left to CUDA's folders): shown by `list` and `check`.
    pub notes: Vec<String>,
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

/// The package a crate depends on to use kopt (a dependency's `name` in `cargo metadata`
/// is the package's, whatever the crate renames it to).
const KOPT_PACKAGE: &str = "kopt";

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
                d.name == KOPT_PACKAGE && d.kind != cargo_metadata::DependencyKind::Development
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
    for (item, spelling) in items {
        let Ok(func) = spec::parse_item(item) else {
            continue;
        };
        let Some(attr) = func.attrs.iter().find(|a| spelling.is_kernel(a.path())) else {
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
        let mut notes = Vec::new();
        match source::entry_presence(&reference.text, &spec.entry) {
            source::EntryPresence::Defined => {}
            source::EntryPresence::Unseen(why) => notes.push(why),
            source::EntryPresence::Absent => {
                out.errors.push(err(
                    launcher.entry_span,
                    format!(
                        "`{}` defines no `__global__` function `{}`",
                        spec.reference, spec.entry
                    ),
                ));
                continue;
            }
        }
        for (file, line, include) in &reference.system_includes {
            notes.push(format!(
                "{file}:{line}: `#include \"{include}\"` is not in the crate; NVRTC looks for it in CUDA's include folders"
            ));
        }
        let hashes = Hashes::of(&spec, &reference);
        let state = selection::resolve(root, &spec, &hashes);
        out.kernels.push(Kernel {
            package: package.to_string(),
            crate_root: root.to_path_buf(),
            file: relf.clone(),
            line,
            spec,
            reference,
            hashes,
            state,
            notes,
        });
    }
}

/// How the kernel attribute can be spelled in one module: `kopt::kernel`, and the names
/// that module's `use` items bring it in under (`use kopt::kernel;`, `use kopt::kernel as
/// k;`, `use kopt::{kernel, ...};`, `use kopt::*;`). Lexical, as rustc's own resolution is
/// not available here: a `use` in a parent module does not reach a child one, as in Rust.
/// The crate must be called `kopt` in the code (the expansion refers to `::kopt`).
#[derive(Debug, Clone)]
struct Spelling {
    imported: Vec<String>,
}

impl Spelling {
    fn of_module(items: &[syn::Item]) -> Self {
        let mut imported = Vec::new();
        for item in items {
            if let syn::Item::Use(u) = item {
                Self::walk(&u.tree, &mut Vec::new(), &mut imported);
            }
        }
        Spelling { imported }
    }

    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<String>) {
        let from_kopt = prefix.len() == 1 && prefix[0] == "kopt";
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                Self::walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if from_kopt && n.ident == "kernel" => out.push("kernel".into()),
            syn::UseTree::Rename(r) if from_kopt && r.ident == "kernel" && r.rename != "_" => {
                out.push(r.rename.to_string())
            }
            syn::UseTree::Glob(_) if from_kopt => out.push("kernel".into()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    Self::walk(t, prefix, out);
                }
            }
            _ => {}
        }
    }

    fn is_kernel(&self, path: &syn::Path) -> bool {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        match segs.as_slice() {
            [krate, name] => krate == "kopt" && name == "kernel",
            [name] => path.leading_colon.is_none() && self.imported.contains(name),
            _ => false,
        }
    }
}

/// Items of a file with the attribute's spelling in their module, descending into inline
/// modules. Bodiless functions come as verbatim tokens, which `spec::parse_item`
/// understands.
fn collect_items(
    items: &[syn::Item],
    out: &mut Vec<(proc_macro2::TokenStream, std::rc::Rc<Spelling>)>,
) {
    use quote::ToTokens;
    let spelling = std::rc::Rc::new(Spelling::of_module(items));
    for item in items {
        match item {
            syn::Item::Fn(f) => out.push((f.to_token_stream(), spelling.clone())),
            syn::Item::Verbatim(ts) => out.push((ts.clone(), spelling.clone())),
            syn::Item::Mod(m) => {
                if let Some((_, inner)) = &m.content {
                    collect_items(inner, out);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launcher(attr: &str, name: &str) -> String {
        format!(
            "#[{attr}(\n    reference = \"kernels/sum.cu\",\n    entry = \"sum_f32\",\n    x: [n],\n    out: [1] inout,\n    grid = ceil_div(n, 256),\n    block = 256,\n    shapes = [{{ n: 1024 }}],\n    bytes = 4 * n,\n)]\npub fn {name}(stream: &CudaStream, x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u64);\n"
        )
    }

    #[test]
    fn the_attribute_is_found_under_the_names_a_use_of_it_gives() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::create_dir_all(dir.path().join("kernels")).unwrap();
        std::fs::write(
            dir.path().join("kernels/sum.cu"),
            "extern \"C\" __global__ void sum_f32(const float* x, float* out, unsigned long long n) {}\n",
        )
        .unwrap();
        let lib = [
            "use kopt::kernel;\n".to_string(),
            launcher("kernel", "plain_use"),
            launcher("kopt::kernel", "full_path"),
            "mod renamed {\n    use kopt::{kernel as gpu_kernel, KernelError};\n".into(),
            launcher("gpu_kernel", "renamed_use"),
            // The parent's `use` does not reach this module: rustc would reject it too.
            launcher("kernel", "not_in_scope"),
            "}\nmod glob {\n    use kopt::*;\n".into(),
            launcher("kernel", "glob_use"),
            "}\nmod other {\n    use something_else::kernel;\n".into(),
            launcher("kernel", "another_crates_kernel"),
            launcher("::kernel", "leading_colons"),
            "}\n".into(),
        ]
        .concat();
        std::fs::write(dir.path().join("src/lib.rs"), lib).unwrap();
        let g = gather_crate("k", dir.path(), &dir.path().join("target"));
        assert!(g.errors.is_empty(), "{:?}", g.errors);
        let mut found: Vec<&str> = g.kernels.iter().map(|k| k.spec.name.as_str()).collect();
        found.sort();
        assert_eq!(found, ["full_path", "glob_use", "plain_use", "renamed_use"]);
    }
}
