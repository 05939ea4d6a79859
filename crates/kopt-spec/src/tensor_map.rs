//! TMA tensor maps as kernel arguments: the annotation's `tensor_maps = { .. }`, and the
//! arguments of `cuTensorMapEncodeTiled` they evaluate to for one launch.
//!
//! A map is declared over a device buffer with its dimensions, strides, box and layout
//! options, each an integer expression of the scalars and the tunables. The launcher and
//! the engine's worker evaluate the same declaration for the version that runs
//! ([`TensorMapArgs::new`]) and hand the result to the driver; every rule the driver
//! would enforce is checked here first, so a bad map is an error that names the map and
//! the field before anything is launched. This module knows no CUDA: the enums carry the
//! values of CUDA's own (`code`), which the two runtimes convert.

use proc_macro2::{Span, TokenStream};
use serde::{Deserialize, Serialize};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{braced, bracketed, parenthesized, Ident, Token};

use crate::expr::{self, Expr, Ty, VarKind};
use crate::spec::DType;

/// Most dimensions a tiled tensor map has (CUDA's limit).
pub const MAX_RANK: usize = 5;

/// A tensor map the annotation declares: `a_map: tensor_map(a, dims = [k, m], box = [64, 128],
/// swizzle = 128)`. Dimensions are listed innermost (contiguous) first, as the driver takes
/// them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMapDecl {
    /// The argument's name, as versions list it in their arguments.
    pub name: String,
    /// The device buffer it describes; its element type is the map's.
    pub buffer: String,
    /// The tensor's size in elements per dimension, innermost first.
    pub dims: Vec<Expr>,
    /// The stride of dimensions 1 and up, in elements. Absent: packed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strides: Option<Vec<Expr>>,
    /// The box one copy moves, in elements per dimension, innermost first.
    #[serde(rename = "box")]
    pub box_dims: Vec<Expr>,
    /// Absent: every element of the box (1 in each dimension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element_strides: Option<Vec<Expr>>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub interleave: Interleave,
    #[serde(default, skip_serializing_if = "is_default")]
    pub swizzle: Swizzle,
    #[serde(default, skip_serializing_if = "is_default")]
    pub l2_promotion: L2Promotion,
    #[serde(default, skip_serializing_if = "is_default")]
    pub oob_fill: OobFill,
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

/// `interleave = none | 16 | 32` (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Interleave {
    #[default]
    #[serde(rename = "none")]
    None,
    #[serde(rename = "16")]
    B16,
    #[serde(rename = "32")]
    B32,
}

/// `swizzle = none | 32 | 64 | 128` (the span in bytes whose 16-byte chunks are permuted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Swizzle {
    #[default]
    #[serde(rename = "none")]
    None,
    #[serde(rename = "32")]
    B32,
    #[serde(rename = "64")]
    B64,
    #[serde(rename = "128")]
    B128,
}

/// `l2_promotion = none | 64 | 128 | 256` (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum L2Promotion {
    #[default]
    #[serde(rename = "none")]
    None,
    #[serde(rename = "64")]
    B64,
    #[serde(rename = "128")]
    B128,
    #[serde(rename = "256")]
    B256,
}

/// `oob_fill = zero | nan`: what a copy reads outside the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OobFill {
    #[default]
    Zero,
    Nan,
}

impl Interleave {
    /// `CUtensorMapInterleave`'s value.
    pub fn code(self) -> u32 {
        self as u32
    }
    fn bytes(self) -> u64 {
        match self {
            Interleave::None => 0,
            Interleave::B16 => 16,
            Interleave::B32 => 32,
        }
    }
}

impl Swizzle {
    /// `CUtensorMapSwizzle`'s value.
    pub fn code(self) -> u32 {
        self as u32
    }
    /// The span in bytes (0 for none).
    pub fn bytes(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }
}

impl L2Promotion {
    /// `CUtensorMapL2promotion`'s value.
    pub fn code(self) -> u32 {
        self as u32
    }
}

impl OobFill {
    /// `CUtensorMapFloatOOBfill`'s value.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// `CUtensorMapDataType`'s value for a buffer's element type. TMA copies bytes, so signed
/// 8- and 16-bit integers travel as their unsigned counterparts.
pub fn data_type_code(dtype: DType) -> u32 {
    match dtype {
        DType::U8 | DType::I8 => 0,
        DType::U16 | DType::I16 => 1,
        DType::U32 => 2,
        DType::I32 => 3,
        DType::U64 => 4,
        DType::I64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::Bf16 => 9,
    }
}

/// The arguments of one `cuTensorMapEncodeTiled` call but the address: a declaration
/// evaluated for one launch of one version. Fixed-size, so the launcher builds it on the
/// stack and compares it with its cache's keys without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapArgs {
    /// The buffer's index among the spec's buffers.
    pub buffer: usize,
    pub dtype: DType,
    pub rank: u32,
    /// Elements per dimension, innermost first (`rank` used).
    pub dims: [u64; MAX_RANK],
    /// Bytes between consecutive elements of dimensions 1.. (`rank - 1` used).
    pub strides: [u64; MAX_RANK - 1],
    pub box_dims: [u32; MAX_RANK],
    pub element_strides: [u32; MAX_RANK],
    pub interleave: Interleave,
    pub swizzle: Swizzle,
    pub l2_promotion: L2Promotion,
    pub oob_fill: OobFill,
}

/// A declaration's fields evaluated to integers (`strides` and `element_strides` empty
/// where the declaration leaves them out).
pub struct Evaluated<'a> {
    pub dims: &'a [i64],
    pub strides: &'a [i64],
    pub box_dims: &'a [i64],
    pub element_strides: &'a [i64],
}

impl TensorMapArgs {
    /// Checks evaluated fields against the driver's rules for a tiled map and converts
    /// strides to bytes. The error names the map and the field, with the rule.
    pub fn new(
        decl: &TensorMapDecl,
        buffer: usize,
        dtype: DType,
        v: Evaluated<'_>,
    ) -> Result<Self, String> {
        let name = &decl.name;
        let bad = |m: String| Err(format!("tensor map `{name}`: {m}"));
        let rank = v.dims.len();
        let elem = dtype.size() as u64;
        let mut out = TensorMapArgs {
            buffer,
            dtype,
            rank: rank as u32,
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK - 1],
            box_dims: [1; MAX_RANK],
            element_strides: [1; MAX_RANK],
            interleave: decl.interleave,
            swizzle: decl.swizzle,
            l2_promotion: decl.l2_promotion,
            oob_fill: decl.oob_fill,
        };
        for (i, &d) in v.dims.iter().enumerate() {
            if !(1..=1i64 << 32).contains(&d) {
                return bad(format!(
                    "dims[{i}] = `{}` is {d}; a dimension is 1 to 2^32 elements",
                    decl.dims[i]
                ));
            }
            out.dims[i] = d as u64;
        }
        let mut packed = out.dims[0] * elem;
        for i in 1..rank {
            let bytes = match v.strides.get(i - 1) {
                Some(&s) if s <= 0 => {
                    return bad(format!(
                        "strides[{}] = `{}` is {s}; a stride is positive",
                        i - 1,
                        stride_text(decl, i - 1)
                    ))
                }
                Some(&s) => (s as u64).saturating_mul(elem),
                None => packed,
            };
            let align = if decl.interleave == Interleave::B32 {
                32
            } else {
                16
            };
            if !bytes.is_multiple_of(align) || bytes >= 1 << 40 {
                return bad(format!(
                    "the stride of dimension {i} is {bytes} bytes; strides must be multiples of {align} bytes below 2^40 ({}); pad the rows, or declare a shape where they are",
                    match v.strides.get(i - 1) {
                        Some(_) => format!("strides[{}] = `{}`", i - 1, stride_text(decl, i - 1)),
                        None => "packed from `dims`".to_string(),
                    }
                ));
            }
            out.strides[i - 1] = bytes;
            packed = bytes.saturating_mul(out.dims[i]);
        }
        for (i, &b) in v.box_dims.iter().enumerate() {
            if !(1..=256).contains(&b) {
                return bad(format!(
                    "box[{i}] = `{}` is {b}; a box dimension is 1 to 256 elements",
                    decl.box_dims[i]
                ));
            }
            out.box_dims[i] = b as u32;
        }
        for (i, &e) in v.element_strides.iter().enumerate() {
            if !(1..=8).contains(&e) {
                let text = decl
                    .element_strides
                    .as_ref()
                    .map(|s| s[i].to_string())
                    .unwrap_or_default();
                return bad(format!(
                    "element_strides[{i}] = `{text}` is {e}; an element stride is 1 to 8"
                ));
            }
            out.element_strides[i] = e as u32;
        }
        let inner = u64::from(out.box_dims[0]) * elem;
        if decl.interleave == Interleave::None {
            if !inner.is_multiple_of(16) {
                return bad(format!(
                    "the box's inner dimension is {inner} bytes (box[0] = `{}` x {elem}); without interleave it must be a multiple of 16 bytes",
                    decl.box_dims[0]
                ));
            }
            if decl.swizzle != Swizzle::None && inner > decl.swizzle.bytes() {
                return bad(format!(
                    "the box's inner dimension is {inner} bytes, more than the {}-byte swizzle span; make box[0] at most {} elements",
                    decl.swizzle.bytes(),
                    decl.swizzle.bytes() / elem
                ));
            }
        } else if decl.interleave == Interleave::B32 && decl.swizzle != Swizzle::B32 {
            return bad("a 32-byte interleave needs `swizzle = 32`".into());
        }
        Ok(out)
    }

    /// Whether the map stays inside a buffer of `len` elements: the last element it can
    /// address is in the buffer (TMA bounds its copies by the map, not by the allocation).
    pub fn check_extent(&self, name: &str, buffer: &str, len: u64) -> Result<(), String> {
        let elem = self.dtype.size() as u64;
        let mut last = (self.dims[0] - 1) * elem;
        for i in 1..self.rank as usize {
            last = last.saturating_add((self.dims[i] - 1).saturating_mul(self.strides[i - 1]));
        }
        let bytes = len.saturating_mul(elem);
        if last + elem > bytes {
            return Err(format!(
                "tensor map `{name}` reaches byte {} of `{buffer}`, which holds {bytes}: its dims and strides describe more than the buffer",
                last + elem
            ));
        }
        Ok(())
    }

    /// Whether the driver takes `address` for this map: 16-byte aligned (32 with a
    /// 32-byte interleave).
    pub fn check_address(&self, name: &str, address: u64) -> Result<(), String> {
        let align = if self.interleave == Interleave::B32 {
            32
        } else {
            16
        };
        if !address.is_multiple_of(align) {
            return Err(format!(
                "tensor map `{name}`: the buffer's address {address:#x} is not {align}-byte aligned (a view that starts mid-allocation?); TMA needs it"
            ));
        }
        Ok(())
    }

    /// The interleave's bytes, for messages.
    pub fn interleave_bytes(&self) -> u64 {
        self.interleave.bytes()
    }
}

fn stride_text(decl: &TensorMapDecl, i: usize) -> String {
    decl.strides
        .as_ref()
        .and_then(|s| s.get(i))
        .map(|e| e.to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// grammar

/// `tensor_maps = { NAME: tensor_map(BUFFER, dims = [..], box = [..], ..), .. }`.
/// `buffers` are the launcher's buffer names with their element types; `taken` the names
/// a map may not take (parameters, computed arguments, tunables).
pub(crate) fn parse(
    v: TokenStream,
    buffers: &[(String, DType)],
    taken: &[String],
    vars: &dyn Fn(&str) -> Option<VarKind>,
    names: &[String],
) -> syn::Result<Vec<TensorMapDecl>> {
    let items = (|c: ParseStream| {
        let content;
        braced!(content in c);
        Punctuated::<RawMap, Token![,]>::parse_terminated(&content)
    })
    .parse2(v)
    .map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("{e} (write `tensor_maps = {{ a_map: tensor_map(a, dims = [cols, rows], box = [64, 64]) }}`)"),
        )
    })?;
    let mut out: Vec<TensorMapDecl> = Vec::new();
    for m in items {
        let name = m.name.to_string();
        if taken.contains(&name) || out.iter().any(|d| d.name == name) {
            return Err(syn::Error::new(
                m.name.span(),
                format!("`{name}` is already a name of this kernel: give the tensor map a name of its own"),
            ));
        }
        let buffer = m.buffer.to_string();
        let Some((_, dtype)) = buffers.iter().find(|(b, _)| *b == buffer) else {
            let all: Vec<String> = buffers.iter().map(|(b, _)| b.clone()).collect();
            let hint = expr::closest(&buffer, &all)
                .map(|c| format!("; did you mean `{c}`?"))
                .unwrap_or_default();
            return Err(syn::Error::new(
                m.buffer.span(),
                format!("`{buffer}` is not a device buffer of the launcher (a tensor map describes one){hint}"),
            ));
        };
        let _ = dtype;
        let mut decl = TensorMapDecl {
            name,
            buffer,
            dims: Vec::new(),
            strides: None,
            box_dims: Vec::new(),
            element_strides: None,
            interleave: Interleave::None,
            swizzle: Swizzle::None,
            l2_promotion: L2Promotion::None,
            oob_fill: OobFill::Zero,
        };
        let mut seen: Vec<String> = Vec::new();
        for (key, value) in &m.fields {
            let k = key.to_string();
            if seen.contains(&k) {
                return Err(syn::Error::new(key.span(), format!("`{k}` is given twice")));
            }
            seen.push(k.clone());
            let list = |value: &syn::Expr| -> syn::Result<Vec<Expr>> {
                let syn::Expr::Array(a) = value else {
                    return Err(syn::Error::new(
                        value.span(),
                        format!("`{k}` is a list, innermost dimension first: `{k} = [cols, rows]`"),
                    ));
                };
                a.elems
                    .iter()
                    .map(|e| expr::from_syn(e, Ty::Int, vars, names))
                    .collect()
            };
            match k.as_str() {
                "dims" => decl.dims = list(value)?,
                "box" => decl.box_dims = list(value)?,
                "strides" => decl.strides = Some(list(value)?),
                "element_strides" => decl.element_strides = Some(list(value)?),
                "interleave" => {
                    decl.interleave = match choice(value, &["none", "16", "32"])? {
                        "16" => Interleave::B16,
                        "32" => Interleave::B32,
                        _ => Interleave::None,
                    }
                }
                "swizzle" => {
                    decl.swizzle = match choice(value, &["none", "32", "64", "128"])? {
                        "32" => Swizzle::B32,
                        "64" => Swizzle::B64,
                        "128" => Swizzle::B128,
                        _ => Swizzle::None,
                    }
                }
                "l2_promotion" => {
                    decl.l2_promotion = match choice(value, &["none", "64", "128", "256"])? {
                        "64" => L2Promotion::B64,
                        "128" => L2Promotion::B128,
                        "256" => L2Promotion::B256,
                        _ => L2Promotion::None,
                    }
                }
                "oob_fill" => {
                    decl.oob_fill = match choice(value, &["zero", "nan"])? {
                        "nan" => OobFill::Nan,
                        _ => OobFill::Zero,
                    }
                }
                other => {
                    return Err(syn::Error::new(
                        key.span(),
                        format!("unknown tensor map field `{other}`; expected dims, box, strides, element_strides, interleave, swizzle, l2_promotion or oob_fill"),
                    ))
                }
            }
        }
        let rank = decl.dims.len();
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(syn::Error::new(
                m.span,
                format!("tensor map `{}` needs `dims = [..]` of 1 to {MAX_RANK} dimensions, innermost first", decl.name),
            ));
        }
        let lengths = [
            ("box", decl.box_dims.len(), rank),
            (
                "strides",
                decl.strides.as_ref().map_or(rank - 1, Vec::len),
                rank - 1,
            ),
            (
                "element_strides",
                decl.element_strides.as_ref().map_or(rank, Vec::len),
                rank,
            ),
        ];
        for (field, got, want) in lengths {
            if got != want {
                return Err(syn::Error::new(
                    m.span,
                    format!(
                        "tensor map `{}`: `{field}` has {got} entries; with {rank} dims it needs {want}{}",
                        decl.name,
                        if field == "strides" { " (the strides of dimensions 1 and up, in elements)" } else { "" }
                    ),
                ));
            }
        }
        if decl.interleave != Interleave::None && rank < 3 {
            return Err(syn::Error::new(
                m.span,
                format!(
                    "tensor map `{}`: an interleaved map has at least 3 dimensions",
                    decl.name
                ),
            ));
        }
        out.push(decl);
    }
    Ok(out)
}

/// A field's word or number among `allowed`.
fn choice<'a>(value: &syn::Expr, allowed: &[&'a str]) -> syn::Result<&'a str> {
    let text = match value {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_digits().to_string(),
        syn::Expr::Path(p) if p.path.get_ident().is_some() => {
            p.path.get_ident().unwrap().to_string()
        }
        _ => String::new(),
    };
    allowed
        .iter()
        .find(|a| **a == text)
        .copied()
        .ok_or_else(|| {
            syn::Error::new(
                value.span(),
                format!("expected one of: {}", allowed.join(", ")),
            )
        })
}

struct RawMap {
    name: Ident,
    buffer: Ident,
    fields: Vec<(Ident, syn::Expr)>,
    span: Span,
}

impl Parse for RawMap {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let kw: Ident = input.parse()?;
        if kw != "tensor_map" {
            return Err(syn::Error::new(
                kw.span(),
                "expected `tensor_map(BUFFER, dims = [..], box = [..], ..)`",
            ));
        }
        let content;
        let paren = parenthesized!(content in input);
        let buffer: Ident = content.parse().map_err(|e| {
            syn::Error::new(e.span(), "a tensor map's first item is the buffer it describes: `tensor_map(a, dims = [..], box = [..])`")
        })?;
        let mut fields = Vec::new();
        while !content.is_empty() {
            content.parse::<Token![,]>()?;
            if content.is_empty() {
                break;
            }
            // `box` is a reserved word of Rust: read any identifier.
            let key: Ident = content.call(syn::ext::IdentExt::parse_any)?;
            content.parse::<Token![=]>()?;
            let value: syn::Expr = if content.peek(syn::token::Bracket) {
                let inner;
                let b = bracketed!(inner in content);
                let elems = Punctuated::<syn::Expr, Token![,]>::parse_terminated(&inner)?;
                syn::Expr::Array(syn::ExprArray {
                    attrs: Vec::new(),
                    bracket_token: b,
                    elems,
                })
            } else {
                content.parse()?
            };
            fields.push((key, value));
        }
        Ok(RawMap {
            span: name.span().join(paren.span.close()).unwrap_or(name.span()),
            name,
            buffer,
            fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(swizzle: Swizzle) -> TensorMapDecl {
        TensorMapDecl {
            name: "a_map".into(),
            buffer: "a".into(),
            dims: vec![Expr::Var("k".into()), Expr::Var("m".into())],
            strides: None,
            box_dims: vec![Expr::Int(64), Expr::Var("BM".into())],
            element_strides: None,
            interleave: Interleave::None,
            swizzle,
            l2_promotion: L2Promotion::B256,
            oob_fill: OobFill::Zero,
        }
    }

    fn eval(
        d: &TensorMapDecl,
        dims: &[i64],
        strides: &[i64],
        box_dims: &[i64],
    ) -> Result<TensorMapArgs, String> {
        TensorMapArgs::new(
            d,
            0,
            DType::F16,
            Evaluated {
                dims,
                strides,
                box_dims,
                element_strides: &[1, 1],
            },
        )
    }

    #[test]
    fn a_packed_map_gets_byte_strides_and_the_drivers_codes() {
        let a = eval(&decl(Swizzle::B128), &[4096, 512], &[], &[64, 128]).unwrap();
        assert_eq!(a.rank, 2);
        assert_eq!(&a.dims[..2], &[4096, 512]);
        assert_eq!(a.strides[0], 8192);
        assert_eq!(&a.box_dims[..2], &[64, 128]);
        assert_eq!(
            (a.swizzle.code(), a.l2_promotion.code(), a.oob_fill.code()),
            (3, 3, 0)
        );
        assert_eq!(data_type_code(DType::F16), 6);
        assert_eq!(data_type_code(DType::Bf16), 9);
        // Declared strides are in elements.
        let b = eval(&decl(Swizzle::B128), &[4000, 512], &[4096], &[64, 128]).unwrap();
        assert_eq!(b.strides[0], 8192);
        a.check_extent("a_map", "a", 4096 * 512).unwrap();
        assert!(a
            .check_extent("a_map", "a", 4096 * 512 - 1)
            .unwrap_err()
            .contains("reaches byte 4194304 of `a`"));
        a.check_address("a_map", 0x7f00_0000_0100).unwrap();
        assert!(a
            .check_address("a_map", 0x7f00_0000_0108)
            .unwrap_err()
            .contains("16-byte aligned"));
    }

    #[test]
    fn what_the_driver_would_refuse_is_an_error_naming_the_field() {
        let d = decl(Swizzle::B128);
        let err =
            |dims: &[i64], strides: &[i64], b: &[i64]| eval(&d, dims, strides, b).unwrap_err();
        assert!(err(&[4095, 512], &[], &[64, 128]).contains(
            "the stride of dimension 1 is 8190 bytes; strides must be multiples of 16 bytes"
        ));
        assert!(err(&[4096, 512], &[], &[64, 300])
            .contains("box[1] = `BM` is 300; a box dimension is 1 to 256"));
        assert!(err(&[4096, 0], &[], &[64, 128]).contains("dims[1] = `m` is 0"));
        assert!(err(&[4096, 512], &[], &[128, 128]).contains(
            "256 bytes, more than the 128-byte swizzle span; make box[0] at most 64 elements"
        ));
        assert!(err(&[4096, 512], &[], &[4, 128]).contains(
            "8 bytes (box[0] = `64` x 2); without interleave it must be a multiple of 16 bytes"
        ));
        assert!(err(&[4096, 512], &[-1], &[64, 128]).contains("a stride is positive"));
        let d = decl(Swizzle::None);
        assert!(
            eval(&d, &[4096, 512], &[], &[128, 256]).is_ok(),
            "no swizzle: no span limit"
        );
    }

    fn parse_text(text: &str) -> syn::Result<Vec<TensorMapDecl>> {
        let vars = |n: &str| ["m", "n", "k", "BM"].contains(&n).then_some(VarKind::Int);
        let names: Vec<String> = ["m", "n", "k", "BM"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        parse(
            text.parse().unwrap(),
            &[("a".into(), DType::F16), ("c".into(), DType::F32)],
            &["a".into(), "c".into(), "m".into()],
            &vars,
            &names,
        )
    }

    #[test]
    fn the_grammar_reads_every_field_and_refuses_what_is_wrong() {
        let maps = parse_text(
            "{ a_map: tensor_map(a, dims = [k, m], box = [64, BM], swizzle = 128, l2_promotion = 256, oob_fill = nan),
               c_map: tensor_map(c, dims = [n, m, 2], strides = [n, m * n], box = [32, 8, 1], element_strides = [1, 1, 1], interleave = none) }",
        )
        .unwrap();
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].box_dims[1], Expr::Var("BM".into()));
        assert_eq!(
            (maps[0].swizzle, maps[0].oob_fill),
            (Swizzle::B128, OobFill::Nan)
        );
        assert_eq!(maps[1].strides.as_ref().unwrap().len(), 2);
        let json = serde_json::to_string(&maps[0]).unwrap();
        assert!(
            json.contains(r#""swizzle":"128""#) && !json.contains("interleave"),
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<TensorMapDecl>(&json).unwrap(),
            maps[0]
        );

        let e = |t: &str| parse_text(t).unwrap_err().to_string();
        assert!(e("{ m: tensor_map(a, dims = [k], box = [8]) }").contains("`m` is already a name"));
        assert!(
            e("{ x: tensor_map(b, dims = [k], box = [8]) }").contains("`b` is not a device buffer")
        );
        assert!(e("{ x: tensor_map(a, dims = [k, m], box = [8]) }")
            .contains("`box` has 1 entries; with 2 dims it needs 2"));
        assert!(
            e("{ x: tensor_map(a, dims = [k, m], box = [8, 8], strides = [k, k]) }")
                .contains("`strides` has 2 entries; with 2 dims it needs 1")
        );
        assert!(
            e("{ x: tensor_map(a, dims = [k], box = [8], swizzle = 96) }")
                .contains("expected one of: none, 32, 64, 128")
        );
        assert!(
            e("{ x: tensor_map(a, dims = [k], box = [8], boxes = [8]) }")
                .contains("unknown tensor map field `boxes`")
        );
        assert!(e("{ x: tensor_map(a, box = [8]) }").contains("needs `dims = [..]`"));
        assert!(e("{ x: tensor_map(a, dims = [q], box = [8]) }").contains("q"));
        assert!(
            e("{ x: tensor_map(a, dims = [k, m], box = [8, 8], interleave = 16) }")
                .contains("at least 3 dimensions")
        );
    }
}
