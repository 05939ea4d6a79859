//! kopt's profile data layer and bottleneck snapshot (placeholder while the crate is written).

pub mod classify;
pub mod collect;
pub mod figures;
pub mod measure;
pub mod metrics;
pub mod ncu;
pub mod sass;
pub mod snapshot;
pub mod structure;
pub mod tools;
