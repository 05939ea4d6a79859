//! The `#[kopt::kernel]` attribute. Use it through the `kopt` crate, which re-exports it
//! with the runtime the expansion calls. All the work is in `kopt_spec::codegen`.

use proc_macro::TokenStream;

/// Declares a CUDA kernel launcher that kopt can verify, measure and optimise.
/// See the `kopt` crate's documentation for the grammar.
#[proc_macro_attribute]
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = kopt_spec::codegen::ExpandContext {
        crate_root: std::env::var_os("CARGO_MANIFEST_DIR")
            .map(Into::into)
            .unwrap_or_default(),
        crate_name: std::env::var("CARGO_PKG_NAME").unwrap_or_default(),
    };
    kopt_spec::codegen::expand(args.into(), item.into(), &cx).into()
}
