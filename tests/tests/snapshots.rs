//! Snapshots of what people and tools read: the macro's expansion for the example's
//! softmax (which has an accepted variant with a region) and the committed file formats.

use std::path::Path;

use kopt_spec::codegen::{expand, ExpandContext};
use kopt_spec::files::{LockFile, Rationale, VariantFile};
use kopt_tests::repo_root;

/// The `#[kopt::kernel]` item named `name` in a source file, split into attribute
/// arguments and the item without that attribute (what the macro receives).
fn annotated_item(file: &Path, name: &str) -> (proc_macro2::TokenStream, proc_macro2::TokenStream) {
    let text = std::fs::read_to_string(file).unwrap();
    let parsed = syn::parse_file(&text).unwrap();
    for item in parsed.items {
        let ts = match item {
            syn::Item::Verbatim(ts) => ts,
            _ => continue,
        };
        let mut f: syn::ForeignItemFn = match syn::parse2(ts) {
            Ok(f) => f,
            Err(_) => continue,
        };
        if f.sig.ident != name {
            continue;
        }
        let pos = f
            .attrs
            .iter()
            .position(|a| {
                a.path()
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "kernel")
            })
            .unwrap();
        let attr = f.attrs.remove(pos);
        let args = match attr.meta {
            syn::Meta::List(l) => l.tokens,
            _ => unreachable!(),
        };
        return (args, quote::ToTokens::to_token_stream(&f));
    }
    panic!("no annotated `{name}` in {}", file.display());
}

#[test]
fn expansion_of_the_example_softmax() {
    let krate = repo_root().join("examples/llm-kernels");
    let (args, item) = annotated_item(&krate.join("src/lib.rs"), "softmax");
    let cx = ExpandContext {
        crate_root: krate.clone(),
        crate_name: "llm-kernels".into(),
    };
    let tokens = expand(args, item, &cx);
    let file: syn::File = syn::parse2(tokens).expect("the expansion is valid Rust");
    let pretty = prettyplease::unparse(&file).replace(&krate.display().to_string(), "<crate>");
    insta::assert_snapshot!(pretty);
}

#[test]
fn committed_files_of_the_example_parse_and_render_identically() {
    let dir = repo_root().join("examples/llm-kernels/kopt/softmax");
    let lock_text = std::fs::read_to_string(dir.join("kopt.lock")).unwrap();
    let lock = LockFile::parse(&lock_text).unwrap();
    assert_eq!(lock.render(), lock_text, "kopt.lock is in canonical form");
    let r =
        Rationale::parse(&std::fs::read_to_string(dir.join("online-vec4/rationale.json")).unwrap())
            .unwrap();
    assert_eq!(
        r.render_markdown(),
        std::fs::read_to_string(dir.join("online-vec4/RATIONALE.md")).unwrap()
    );
    VariantFile::parse(&std::fs::read_to_string(dir.join("online-vec4/variant.toml")).unwrap())
        .unwrap();
}

#[test]
fn rationale_markdown_of_the_shipped_variant() {
    let dir = repo_root().join("examples/llm-kernels/kopt/softmax/online-vec4");
    let r =
        Rationale::parse(&std::fs::read_to_string(dir.join("rationale.json")).unwrap()).unwrap();
    insta::assert_snapshot!(r.render_markdown());
}
