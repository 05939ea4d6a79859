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
    // The verified PTX is embedded as it is committed; the snapshot names it instead of
    // repeating thousands of lines.
    let lock =
        LockFile::parse(&std::fs::read_to_string(krate.join("kopt/softmax/kopt.lock")).unwrap())
            .unwrap();
    let mut pretty = pretty;
    for e in lock.accepted.iter().filter(|e| e.ptx.is_some()) {
        let rel = format!("kopt/softmax/{}/kernel.ptx", e.variant);
        let ptx = std::fs::read_to_string(krate.join(&rel)).unwrap();
        let literal = format!("{ptx:?}");
        assert!(pretty.contains(&literal), "{rel} is embedded as it is");
        pretty = pretty.replace(&literal, &format!("\"<{rel}>\""));
    }
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

/// A scratch crate holding `kernel` (from `tests/fixtures/candle-style/kernels`) as its
/// reference and one variant accepted for sm_90, recorded as `cargo kopt accept` records
/// one: the reference's source, built with `defines`, launched with `block` (text), with
/// `ptx` as the PTX its verification loaded, if given.
fn crate_with_variant(
    kernel: &str,
    args: &proc_macro2::TokenStream,
    item: &proc_macro2::TokenStream,
    variant_id: &str,
    (defines, block): (&[(&str, i64)], &str),
    ptx: Option<&str>,
    variant_args: Option<&[&str]>,
) -> tempfile::TempDir {
    use kopt_spec::files::{self, LockEntry, LockFile, VariantFile, VerifiedBy};
    use kopt_spec::{selection::Hashes, source, spec};

    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path();
    std::fs::create_dir_all(krate.join("kernels")).unwrap();
    let kernel_text = std::fs::read_to_string(
        repo_root()
            .join("tests/fixtures/candle-style/kernels")
            .join(kernel),
    )
    .unwrap();
    std::fs::write(krate.join("kernels").join(kernel), &kernel_text).unwrap();
    let f = spec::parse_item(item.clone()).unwrap();
    let (s, _) = spec::parse_kernel(args.clone(), &f).unwrap();
    let reference = source::amalgamate(krate, &s.reference, &s.include).unwrap();
    let hashes = Hashes::of(&s, &reference);
    let vdir = files::kernel_dir(krate, &s.name).join(variant_id);
    std::fs::create_dir_all(&vdir).unwrap();
    let mut launch = s.launch.clone();
    launch.block[0] = kopt_spec::expr::parse_str(
        block,
        kopt_spec::expr::Ty::Int,
        &|_| Some(kopt_spec::expr::VarKind::Int),
        &[],
    )
    .unwrap();
    let variant = VariantFile {
        format: files::FORMAT,
        kernel: s.name.clone(),
        id: variant_id.into(),
        entry: s.entry.clone(),
        args: variant_args.map(|a| a.iter().map(|s| s.to_string()).collect()),
        launch,
        defines: defines.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        options: vec![],
    };
    let variant_text = variant.render();
    std::fs::write(vdir.join(files::VARIANT_FILE), &variant_text).unwrap();
    std::fs::write(vdir.join(files::SOURCE_FILE), &kernel_text).unwrap();
    if let Some(ptx) = ptx {
        std::fs::write(vdir.join(files::PTX_FILE), ptx).unwrap();
    }
    let mut lock = LockFile::new(&s.name);
    lock.accepted.push(LockEntry {
        arch: "sm_90".into(),
        device: None,
        variant: variant_id.into(),
        region: None,
        verified_by: VerifiedBy::Kopt,
        reference_hash: hashes.reference.clone(),
        spec_hash: hashes.spec.clone(),
        source_hash: source::hash(kernel_text.as_bytes()),
        variant_hash: source::hash(variant_text.as_bytes()),
        ptx: ptx.map(|p| files::PtxRecord {
            hash: source::hash(p.as_bytes()),
            nvrtc: "13.0".into(),
            arch: "sm_90".into(),
            symbol: None,
        }),
    });
    std::fs::write(
        files::kernel_dir(krate, &s.name).join(files::LOCK_FILE),
        lock.render(),
    )
    .unwrap();
    dir
}

fn expand_in(
    krate: &Path,
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> String {
    let cx = ExpandContext {
        crate_root: krate.to_path_buf(),
        crate_name: "candle-style".into(),
    };
    let tokens = expand(args, item, &cx);
    let file: syn::File = syn::parse2(tokens).expect("the expansion is valid Rust");
    let pretty = prettyplease::unparse(&file).replace(&krate.display().to_string(), "<crate>");
    assert!(
        pretty.contains("unusable: &[]") && !pretty.contains("compile_error"),
        "the variant's files resolve as usable:\n{pretty}"
    );
    pretty
}

/// A kernel whose arguments are not the launcher's parameters, with an accepted variant
/// built with other defines and launch rule: the expansion passes the kernel exactly its
/// arguments (the row count is launch-only, three `size_t`s are computed) and `info`'s
/// fixed contents are the annotation's business, not the launcher's.
#[test]
fn expansion_of_a_kernel_with_launch_only_computed_and_fixed_arguments() {
    let args = quote::quote! {
        reference = "kernels/sum_rows.cu",
        entry = "sum_rows_f32",
        info: [4] values(rows, cols, cols, 1),
        x: [rows * cols],
        y: [rows],
        args = (src_numel: u64 = rows * cols, el_to_sum_per_block: u64 = cols, num_dims: u64 = 2, info, x, y),
        grid = rows,
        block = min(BLOCK, next_pow2(cols)),
        tunables = { BLOCK: 256 in [128, 256, 512, 1024] },
        shapes = [{ rows: 4096, cols: 4096 }, { rows: 64, cols: 100 }],
    };
    let item = quote::quote! {
        /// Sums of the rows of a `rows x cols` fp32 matrix.
        pub fn sum_rows(stream: &CudaStream, info: &CudaSlice<u64>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
    };
    let dir = crate_with_variant(
        "sum_rows.cu",
        &args,
        &item,
        "block-1024",
        (&[("BLOCK", 1024)], "min(BLOCK, next_pow2(cols / 2))"),
        Some(".version 9.0\n.target sm_90\n.address_size 64\n\n.visible .entry sum_rows_f32(\n)\n{\n\tret;\n}\n"),
        None,
    );
    let pretty = expand_in(dir.path(), args, item);
    assert!(pretty.contains("id: \"block-1024\""), "{pretty}");
    insta::assert_snapshot!(pretty);
}

/// A computed argument that reads the geometry is compiled for each version: the
/// variant's `block_size` is its own block, not the reference's.
#[test]
fn a_computed_argument_follows_each_versions_launch_rule() {
    let args = quote::quote! {
        reference = "kernels/softmax.cu",
        entry = "softmax_f32",
        x: [rows * ncols],
        y: [rows * ncols],
        args = (x, y, ncols, block_size: i32 = block_x),
        grid = rows,
        block = BLOCK,
        shapes = [{ rows: 8192, ncols: 4096 }],
        tunables = { BLOCK: 256 in [128, 256, 512, 1024] },
    };
    let item = quote::quote! {
        pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);
    };
    let dir = crate_with_variant(
        "softmax.cu",
        &args,
        &item,
        "wide",
        (&[("BLOCK", 1024)], "BLOCK / 2"),
        None,
        None,
    );
    let pretty = expand_in(dir.path(), args, item);
    let def = &pretty[pretty
        .find("::kopt::ComputedArgDef {")
        .expect("a computed argument")..];
    let def: String = def[..def.find("},").unwrap()].split_whitespace().collect();
    assert_eq!(
        def,
        // The variant's `block = BLOCK / 2` under its `BLOCK = 1024`.
        "::kopt::ComputedArgDef{name:\"block_size\",ty:\"i32\",reference:&[::kopt::expr::Op::Int(256i64)],variants:&[&[::kopt::expr::Op::Bin(::kopt::expr::BinOp::Div),::kopt::expr::Op::Int(1024i64),::kopt::expr::Op::Int(2i64),],],"
    );
    // The pool holds every parameter and the computed block size; the kernel gets x, y,
    // ncols and the block size (`rows` only sizes the grid).
    let params = &pretty[pretty.find("let mut __kopt_pool").unwrap()..];
    let params: Vec<&str> = params[..params.find("];").unwrap()]
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().split(' ').next().unwrap())
        .collect();
    assert_eq!(
        params,
        [
            "&__kopt_ptr0",
            "&__kopt_ptr1",
            "&rows",
            "&ncols",
            "&__kopt_computed0"
        ]
    );
    assert_eq!(
        pretty.matches("args: &[0u16, 1u16, 3u16, 4u16]").count(),
        2,
        "{pretty}"
    );
    assert!(pretty
        .contains("let __kopt_computed0: i32 = __kopt_launch.computed(0usize, &__kopt_args)?;"));
}

/// A variant that takes a tensor map where the reference takes the pointer: the pool gets
/// the map, encoded for the version that runs, and each version picks its own arguments.
#[test]
fn expansion_of_a_variant_that_takes_a_tensor_map() {
    let args = quote::quote! {
        reference = "kernels/softmax.cu",
        entry = "softmax_f32",
        x: [rows * ncols],
        y: [rows * ncols],
        tensor_maps = { x_map: tensor_map(x, dims = [ncols, rows], box = [BOX, 1], l2_promotion = 128) },
        args = (x, y, ncols, block_size: i32 = block_x),
        grid = rows,
        block = BLOCK,
        shapes = [{ rows: 8192, ncols: 4096 }],
        tunables = { BLOCK: 256 in [128, 256, 512, 1024], BOX: 64 in [64, 256] },
    };
    let item = quote::quote! {
        pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);
    };
    let dir = crate_with_variant(
        "softmax.cu",
        &args,
        &item,
        "tma",
        (&[("BLOCK", 256), ("BOX", 256)], "BLOCK"),
        None,
        Some(&["x_map", "y", "ncols", "block_size"]),
    );
    let pretty = expand_in(dir.path(), args, item);
    insta::assert_snapshot!(pretty);
}
