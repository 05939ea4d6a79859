//! What `#[kopt::kernel]` expands to. Kept here, beside the grammar and the file formats
//! it reads, so that the proc-macro crate stays a thin shell and the expansion can be
//! snapshot-tested as plain code.
//!
//! The expansion is a launcher with the annotated signature and a `static` holding the
//! kernel's definition: the reference and every usable accepted variant (source, entry,
//! options, launch rule and region as compiled expression programs). Variant files are
//! read here, at build time; the runtime never touches the file system.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

use crate::expr::{BinOp, Func, Op};
use crate::files;
use crate::selection::{self, Hashes, KernelState};
use crate::source;
use crate::spec::{self, KernelSpec, Launcher, Param};

/// Where the expansion happens.
#[derive(Debug, Clone)]
pub struct ExpandContext {
    /// The annotated crate's root (`CARGO_MANIFEST_DIR`).
    pub crate_root: PathBuf,
    pub crate_name: String,
}

/// Expands the attribute. Errors become `compile_error!`s at the offending tokens.
pub fn expand(args: TokenStream, item: TokenStream, cx: &ExpandContext) -> TokenStream {
    match try_expand(args, item, cx) {
        Ok(ts) => ts,
        Err(e) => e.to_compile_error(),
    }
}

fn try_expand(
    args: TokenStream,
    item: TokenStream,
    cx: &ExpandContext,
) -> syn::Result<TokenStream> {
    let item = spec::parse_item(item)?;
    let (spec, launcher) = spec::parse_kernel(args, &item)?;
    let reference = source::amalgamate(&cx.crate_root, &spec.reference, &spec.include)
        .map_err(|e| syn::Error::new(launcher.reference_span, format!("{e}")))?;
    // A macro- or template-made entry passes here; NVRTC has the last word (`cargo kopt
    // check`, and the first launch).
    if source::entry_presence(&reference.text, &spec.entry) == source::EntryPresence::Absent {
        return Err(syn::Error::new(
            launcher.entry_span,
            format!(
                "`{}` defines no `extern \"C\" __global__` function `{}`; set `entry = \"...\"` to the kernel's name",
                spec.reference, spec.entry
            ),
        ));
    }
    let hashes = Hashes::of(&spec, &reference);
    let state = selection::resolve(&cx.crate_root, &spec, &hashes);
    Ok(generate(
        &spec,
        &launcher,
        &reference.text,
        &reference.files,
        &state,
        cx,
    ))
}

/// The expansion proper, from already-resolved inputs (used directly by snapshot tests).
pub fn generate(
    spec: &KernelSpec,
    launcher: &Launcher,
    reference_source: &str,
    reference_files: &[PathBuf],
    state: &KernelState,
    cx: &ExpandContext,
) -> TokenStream {
    let kopt = quote!(::kopt);
    let Launcher {
        vis,
        attrs,
        ident,
        stream,
        params,
        ..
    } = launcher;
    let static_ident = format_ident!("{}", ident.to_string().to_uppercase(), span = ident.span());

    // --- the launcher body
    let scalar_values: Vec<TokenStream> = spec
        .scalars()
        .map(|s| {
            let id = format_ident!("{}", s.name);
            if s.ty.is_float() {
                quote!(0i64)
            } else {
                quote!(#id as i64)
            }
        })
        .collect();
    let n_scalars = scalar_values.len();
    let mut checks = Vec::new();
    let mut ptrs = Vec::new();
    let mut slots = Vec::new();
    let mut buffer_index = 0usize;
    for (i, p) in spec.params.iter().enumerate() {
        let id = format_ident!("{}", p.name());
        if let Param::Buffer(b) = p {
            let bi = buffer_index;
            buffer_index += 1;
            checks.push(quote! {
                #static_ident.check_len(#bi, #kopt::__private::DeviceSlice::len(#id), &__kopt_args)?;
            });
            let ptr = format_ident!("__kopt_ptr{}", i);
            let guard = format_ident!("__kopt_sync{}", i);
            if b.is_output() {
                ptrs.push(quote! {
                    let (#ptr, #guard) = #kopt::__private::DevicePtrMut::device_ptr_mut(#id, __kopt_stream);
                });
            } else {
                ptrs.push(quote! {
                    let (#ptr, #guard) = #kopt::__private::DevicePtr::device_ptr(#id, __kopt_stream);
                });
            }
        }
    }
    // The launch's pool, from which the version `prepare` picked takes its arguments in its
    // order: the parameters (buffers' pointers, scalars as received), the computed
    // arguments and the tensor maps, both evaluated for that version into stack locals (the
    // maps' fields once, by `prepare`, which picks the version by whether they encode).
    for (i, p) in spec.params.iter().enumerate() {
        match p {
            Param::Buffer(_) => {
                let ptr = format_ident!("__kopt_ptr{}", i);
                slots.push(quote!(&#ptr as *const _ as *mut ::core::ffi::c_void));
            }
            Param::Scalar(s) => {
                let id = format_ident!("{}", s.name);
                slots.push(quote!(&#id as *const _ as *mut ::core::ffi::c_void));
            }
        }
    }
    let mut computed = Vec::new();
    for (index, def) in spec.computed_args().enumerate() {
        let local = format_ident!("__kopt_computed{}", index);
        let ty = format_ident!("{}", def.ty.name());
        computed.push(quote! {
            let #local: #ty = __kopt_launch.computed(#index, &__kopt_args)?;
        });
        slots.push(quote!(&#local as *const _ as *mut ::core::ffi::c_void));
    }
    let mut maps = Vec::new();
    for (index, m) in spec.tensor_maps.iter().enumerate() {
        let local = format_ident!("__kopt_map{}", index);
        let param = spec
            .params
            .iter()
            .position(|p| p.name() == m.buffer)
            .expect("checked at parse");
        let ptr = format_ident!("__kopt_ptr{}", param);
        maps.push(quote! {
            let #local = __kopt_launch.tensor_map(#index, #ptr as u64)?;
        });
        slots.push(quote!(&#local as *const _ as *mut ::core::ffi::c_void));
    }
    let n_params = slots.len();
    // One slot per declared map, which `prepare` fills with the picked version's maps.
    let n_maps = spec.tensor_maps.len();
    let (map_slots, map_slots_arg) = if n_maps == 0 {
        (quote!(), quote!(&mut []))
    } else {
        (
            quote! {
                let mut __kopt_maps: [::core::option::Option<#kopt::__private::TensorMapArgs>; #n_maps] =
                    [::core::option::Option::None; #n_maps];
            },
            quote!(&mut __kopt_maps),
        )
    };
    let param_decls = params.iter().map(|(id, ty)| quote!(#id: #ty));
    let doc = format!(
        " Launches `{}` from `{}` (generated by `#[kopt::kernel]`): the accepted variant for the device's architecture where one applies, else the reference. See [`{}`] for introspection.",
        spec.entry, spec.reference, static_ident
    );

    // --- the definition
    let defines = spec.default_defines();
    let reference_def = variant_def(
        &kopt,
        spec,
        "reference",
        None,
        None,
        reference_source,
        &spec.entry,
        &spec.reference_options(),
        &spec.launch,
        &defines,
        None,
        None,
    );
    let usable: Vec<_> = state
        .entries
        .iter()
        .filter_map(|e| e.status.as_ref().ok().map(|u| (&e.entry, u)))
        .collect();
    let variants: Vec<TokenStream> = usable
        .iter()
        .map(|&(entry, u)| {
            variant_def(
                &kopt,
                spec,
                &entry.variant,
                Some((&entry.arch, entry.device.as_deref())),
                u.region
                    .as_ref()
                    .map(|r| (entry.region.clone().unwrap_or_default(), r)),
                &u.source,
                &u.variant.entry,
                &u.variant.compile_options(),
                &u.variant.launch,
                &u.variant.defines,
                u.ptx.as_ref().map(|p| {
                    let symbol = p.record.symbol.as_deref().unwrap_or(&u.variant.entry);
                    (p.text.as_str(), symbol, p.record.nvrtc.as_str())
                }),
                u.variant.args.as_deref(),
            )
        })
        .collect();
    let unusable: Vec<TokenStream> = state
        .entries
        .iter()
        .filter_map(|e| e.status.as_ref().err().map(|why| (&e.entry, why)))
        .map(|(entry, why)| {
            let arch = &entry.arch;
            let variant = &entry.variant;
            let reason = why.describe();
            quote!(#kopt::UnusableDef { arch: #arch, variant: #variant, reason: #reason })
        })
        .chain(
            state
                .problems
                .iter()
                .filter(|p| p.path.ends_with(files::LOCK_FILE))
                .map(|p| {
                    let reason = &p.problem;
                    quote!(#kopt::UnusableDef { arch: "*", variant: "*", reason: #reason })
                }),
        )
        .collect();
    let buffers = spec.buffers().map(|b| {
        let name = &b.name;
        let len = ops_tokens(
            &kopt,
            &spec
                .compile_expr(&b.len, &BTreeMap::new())
                .expect("checked at parse"),
        );
        quote!(#kopt::BufferDef { name: #name, len: #len })
    });
    // Each computed argument's program for the reference and for every embedded variant
    // (aligned with `variants`), under that version's launch rule and defines.
    let computed_defs: Vec<TokenStream> = spec
        .computed_args()
        .map(|c| {
            let name = &c.name;
            let ty = c.ty.name();
            let program = |launch: &spec::LaunchRule, defines: &BTreeMap<String, i64>| {
                ops_tokens(
                    &kopt,
                    &spec
                        .computed_program(c, launch, defines)
                        .expect("checked at parse and when the files were resolved"),
                )
            };
            let reference = program(&spec.launch, &defines);
            let per_variant = usable
                .iter()
                .map(|(_, u)| program(&u.variant.launch, &u.variant.defines));
            quote!(#kopt::ComputedArgDef {
                name: #name,
                ty: #ty,
                reference: #reference,
                variants: &[#(#per_variant),*],
            })
        })
        .collect();
    let scalar_names = spec.scalars().map(|s| s.name.as_str());
    let name = &spec.name;
    let crate_name = &cx.crate_name;
    let spec_json = spec.canonical_json();

    let def = quote!(#kopt::KernelDef {
        name: #name,
        crate_name: #crate_name,
        spec_json: #spec_json,
        scalars: &[#(#scalar_names),*],
        buffers: &[#(#buffers),*],
        reference: #reference_def,
        variants: &[#(#variants),*],
        unusable: &[#(#unusable),*],
    });
    // Each tensor map's field programs for the reference and every embedded variant.
    let map_defs: Vec<TokenStream> = spec
        .tensor_maps
        .iter()
        .map(|m| {
            let name = &m.name;
            let buffer = spec
                .buffers()
                .position(|b| b.name == m.buffer)
                .expect("checked at parse");
            let programs = |defines: &BTreeMap<String, i64>| {
                let list = |exprs: &[crate::expr::Expr]| {
                    let items = exprs.iter().map(|e| {
                        ops_tokens(
                            &kopt,
                            &spec
                                .compile_expr(e, defines)
                                .expect("checked at parse and when the files were resolved"),
                        )
                    });
                    quote!(&[#(#items),*])
                };
                let dims = list(&m.dims);
                let strides = list(m.strides.as_deref().unwrap_or(&[]));
                let box_dims = list(&m.box_dims);
                let element_strides = list(m.element_strides.as_deref().unwrap_or(&[]));
                quote!(#kopt::MapPrograms {
                    dims: #dims,
                    strides: #strides,
                    box_dims: #box_dims,
                    element_strides: #element_strides,
                })
            };
            let reference = programs(&defines);
            let per_variant = usable.iter().map(|(_, u)| programs(&u.variant.defines));
            quote!(#kopt::TensorMapDef {
                name: #name,
                buffer: #buffer,
                reference: #reference,
                variants: &[#(#per_variant),*],
            })
        })
        .collect();
    let constructor = if computed_defs.is_empty() && map_defs.is_empty() {
        quote!(#kopt::Kernel::new(#def))
    } else {
        quote!(#kopt::Kernel::with_args(#def, &[#(#computed_defs),*], &[#(#map_defs),*]))
    };

    // Cargo reruns the macro when any file it read changes.
    let tracked = reference_files
        .iter()
        .chain(state.tracked.iter())
        .map(|p| path_literal(p))
        .map(|p| {
            quote!(
                const _: &[u8] = ::core::include_bytes!(#p);
            )
        });

    quote! {
        #(#attrs)*
        #[doc = #doc]
        // The launcher mirrors the kernel's parameter list, however long it is.
        #[allow(clippy::too_many_arguments)]
        #vis fn #ident(#stream: &#kopt::__private::CudaStream, #(#param_decls),*) -> ::core::result::Result<(), #kopt::Error> {
            let __kopt_stream: &#kopt::__private::CudaStream = #stream;
            let __kopt_args: [i64; #n_scalars] = [#(#scalar_values),*];
            #(#checks)*
            #map_slots
            let __kopt_launch = #static_ident.prepare(__kopt_stream, &__kopt_args, #map_slots_arg)?;
            #(#computed)*
            #(#ptrs)*
            #(#maps)*
            let mut __kopt_pool: [*mut ::core::ffi::c_void; #n_params] = [#(#slots),*];
            // SAFETY: each version's arguments, picked from the pool, match its declared
            // signature in order and type, every buffer was checked against its declared
            // length, and the pointers stay valid until the sync guards drop after the
            // launch is enqueued.
            unsafe { __kopt_launch.launch(__kopt_stream, &mut __kopt_pool) }
        }

        #[doc = concat!(" The kopt definition of [`", stringify!(#ident), "`]: its spec, variants, and which one runs where.")]
        #vis static #static_ident: #kopt::Kernel = #constructor;

        #(#tracked)*
    }
}

#[allow(clippy::too_many_arguments)]
fn variant_def(
    kopt: &TokenStream,
    spec: &KernelSpec,
    id: &str,
    key: Option<(&str, Option<&str>)>,
    region: Option<(String, &crate::expr::Expr)>,
    source: &str,
    entry: &str,
    options: &[String],
    launch: &spec::LaunchRule,
    defines: &BTreeMap<String, i64>,
    ptx: Option<(&str, &str, &str)>,
    args: Option<&[String]>,
) -> TokenStream {
    let order: Vec<u16> = spec
        .version_args(args)
        .expect("checked when the files were resolved")
        .iter()
        .map(|a| spec.pool_index(a) as u16)
        .collect();
    let compile = |e: &crate::expr::Expr| {
        ops_tokens(
            kopt,
            &spec
                .compile_expr(e, defines)
                .expect("checked when the files were resolved"),
        )
    };
    let grid = launch.grid.iter().map(compile);
    let block = launch.block.iter().map(compile);
    let smem = compile(&launch.smem);
    let cluster = match &launch.cluster {
        Some(c) => {
            let c = c.iter().map(compile);
            quote!(::core::option::Option::Some([#(#c),*]))
        }
        None => quote!(::core::option::Option::None),
    };
    // The reference runs every shape; a variant only where its region and the constraints
    // that depend on its build hold.
    let applies = match key {
        None => None,
        Some(_) => spec.variant_applies(region.as_ref().map(|(t, e)| (t.as_str(), *e)), defines),
    };
    let some = |v: Option<&str>| match v {
        Some(a) => quote!(::core::option::Option::Some(#a)),
        None => quote!(::core::option::Option::None),
    };
    let arch = some(key.map(|(a, _)| a));
    let device = some(key.and_then(|(_, d)| d));
    let region = match applies {
        Some((text, e)) => {
            let prog = ops_tokens(kopt, &spec.compile_expr(&e, defines).expect("checked"));
            quote!(::core::option::Option::Some(#kopt::RegionDef { text: #text, program: #prog }))
        }
        None => quote!(::core::option::Option::None),
    };
    let ptx = match ptx {
        Some((text, symbol, nvrtc)) => quote!(::core::option::Option::Some(#kopt::PtxDef {
            text: #text,
            symbol: #symbol,
            nvrtc: #nvrtc,
        })),
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #kopt::VariantDef {
            id: #id,
            arch: #arch,
            device: #device,
            region: #region,
            source: #source,
            entry: #entry,
            options: &[#(#options),*],
            grid: [#(#grid),*],
            block: [#(#block),*],
            smem: #smem,
            cluster: #cluster,
            ptx: #ptx,
            args: &[#(#order),*],
        }
    }
}

fn ops_tokens(kopt: &TokenStream, ops: &[Op]) -> TokenStream {
    let items = ops.iter().map(|op| {
        let e = quote!(#kopt::expr);
        match *op {
            Op::Int(i) => quote!(#e::Op::Int(#i)),
            Op::Var(v) => quote!(#e::Op::Var(#v)),
            Op::Neg => quote!(#e::Op::Neg),
            Op::Not => quote!(#e::Op::Not),
            Op::And(n) => quote!(#e::Op::And(#n)),
            Op::Or(n) => quote!(#e::Op::Or(#n)),
            Op::If(a, b) => quote!(#e::Op::If(#a, #b)),
            Op::Bin(b) => {
                let name = format_ident!("{}", binop_name(b));
                quote!(#e::Op::Bin(#e::BinOp::#name))
            }
            Op::Call(f) => {
                let name = format_ident!("{}", func_name(f));
                quote!(#e::Op::Call(#e::Func::#name))
            }
        }
    });
    quote!(&[#(#items),*])
}

fn binop_name(b: BinOp) -> &'static str {
    match b {
        BinOp::Add => "Add",
        BinOp::Sub => "Sub",
        BinOp::Mul => "Mul",
        BinOp::Div => "Div",
        BinOp::Rem => "Rem",
        BinOp::Shl => "Shl",
        BinOp::Shr => "Shr",
        BinOp::BitAnd => "BitAnd",
        BinOp::BitOr => "BitOr",
        BinOp::Eq => "Eq",
        BinOp::Ne => "Ne",
        BinOp::Lt => "Lt",
        BinOp::Le => "Le",
        BinOp::Gt => "Gt",
        BinOp::Ge => "Ge",
        BinOp::And => "And",
        BinOp::Or => "Or",
    }
}

fn func_name(f: Func) -> &'static str {
    match f {
        Func::Min => "Min",
        Func::Max => "Max",
        Func::CeilDiv => "CeilDiv",
        Func::RoundUp => "RoundUp",
        Func::NextPow2 => "NextPow2",
    }
}

fn path_literal(p: &Path) -> syn::LitStr {
    syn::LitStr::new(&p.to_string_lossy(), Span::call_site())
}
