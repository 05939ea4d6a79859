//! The example crate's kernels, read the way `cargo kopt` reads them.

use std::path::PathBuf;

pub fn example_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels")
}

/// The spec of the example kernel `name` and its amalgamated reference source.
pub fn example_kernel(name: &str) -> (kopt_spec::KernelSpec, String) {
    let root = example_root();
    let text = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let file = syn::parse_file(&text).unwrap();
    for item in file.items {
        let syn::Item::Verbatim(ts) = item else {
            continue;
        };
        let Ok(f) = kopt_spec::spec::parse_item(ts) else {
            continue;
        };
        if f.sig.ident != name {
            continue;
        }
        let attr = f
            .attrs
            .iter()
            .find(|a| {
                a.path()
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "kernel")
            })
            .unwrap();
        let syn::Meta::List(l) = &attr.meta else {
            unreachable!()
        };
        let (spec, _) = kopt_spec::spec::parse_kernel(l.tokens.clone(), &f).unwrap();
        let src = kopt_spec::source::amalgamate(&root, &spec.reference, &spec.include).unwrap();
        return (spec, src.text);
    }
    panic!("no annotated kernel `{name}` in {}", root.display())
}
