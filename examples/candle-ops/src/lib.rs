//! kopt inside a candle crate: candle `CustomOp`s whose CUDA kernels are candle's own
//! (`kernels/candle/`, copied byte for byte from candle-kernels 0.11.1), launched through
//! `#[kopt::kernel]` with the geometry candle-nn gives them, so that a variant accepted for
//! the GPU's architecture replaces candle's kernel without a change to the calling code.
//!
//! - [`kernels`]: the annotated launchers (softmax and RMS norm, bf16 and f32).
//! - [`ops`]: `softmax_last_dim` and `rms_norm`, drop-in for `candle_nn::ops`'.
//! - [`model`]: a decoder step that uses them, with either implementation.
//! - [`check`]: kopt's comparison rule, for the tests and the bench.

pub mod check;
pub mod kernels;
pub mod model;
pub mod ops;
