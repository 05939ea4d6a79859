//! The one grammar and the on-disk formats of kopt, shared by the `#[kopt::kernel]` macro,
//! the `kopt` runtime and `cargo kopt`.
//!
//! - [`spec`]: the annotation, parsed into a [`spec::KernelSpec`];
//! - [`expr`]: the integer expression language of lengths, geometry and regions, and its
//!   allocation-free evaluator;
//! - [`source`]: include resolution (amalgamation) and hashing of kernel sources;
//! - [`shapes`]: shape arithmetic: bytes, coordinates, and the held-out shapes;
//! - [`files`]: `kopt.lock`, `variant.toml`, `rationale.json`, `RATIONALE.md`;
//! - [`selection`]: which committed variants are usable, and why not;
//! - [`search_bench`]: the search benchmark's file (landscape, convergence rows), written
//!   by the search and read by the report;
//! - [`capture`]: what a program's launchers record with `KOPT_CAPTURE` (a manifest and
//!   safetensors files), read back by `cargo kopt`;
//! - [`tensor_map`]: TMA tensor maps as kernel arguments: their grammar, and the
//!   driver's arguments they evaluate to;
//! - [`codegen`]: the macro's expansion.

pub mod capture;
pub mod codegen;
pub mod expr;
pub mod files;
pub mod regions;
pub mod search_bench;
pub mod selection;
pub mod shapes;
pub mod source;
pub mod spec;
pub mod tensor_map;

pub use spec::KernelSpec;
