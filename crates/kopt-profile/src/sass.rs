//! Collector (c): summaries of machine code (SASS, as `cuobjdump -sass` or `nvdisasm`
//! print it) and of PTX (as NVRTC emits it): instructions by class, the width of global
//! loads and stores, local-memory traffic (spills), tensor-core instructions, barriers.
//!
//! The counts are static (instructions in the code, not executed): they say what the
//! compiler made of the source (`LDG.E.128` or four `LDG.E`, `HMMA` or scalar `FFMA`,
//! `LDL`/`STL` spills), which the executed-instruction metrics of ncu cannot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// A static summary of SASS or PTX.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeSummary {
    /// `sass` or `ptx`.
    pub kind: String,
    /// Kernels and functions named in the listing.
    pub functions: Vec<String>,
    pub instructions: usize,
    /// Instructions by class (`global load`, `fp32`, `control`...; see [`sass_class`]).
    pub classes: BTreeMap<String, usize>,
    /// Opcodes (without modifiers) and their counts.
    pub opcodes: BTreeMap<String, usize>,
    /// Global loads and stores by width in bits.
    pub global_loads: BTreeMap<u32, usize>,
    pub global_stores: BTreeMap<u32, usize>,
    pub shared_loads: BTreeMap<u32, usize>,
    pub shared_stores: BTreeMap<u32, usize>,
    /// Local-memory loads and stores (`LDL`/`STL`, `ld.local`/`st.local`): spills, or
    /// arrays the compiler could not keep in registers.
    pub local_loads: usize,
    pub local_stores: usize,
    /// Atomic and reduction instructions by opcode.
    pub atomics: BTreeMap<String, usize>,
    /// Block barriers (`BAR.SYNC`, `bar.sync`/`barrier.sync`).
    pub barriers: usize,
    /// Tensor-core instructions by opcode (`HMMA`, `HGMMA`, `mma`, `wgmma`...).
    pub tensor: BTreeMap<String, usize>,
}

impl CodeSummary {
    /// The width most global loads use, in bits.
    pub fn main_global_load_bits(&self) -> Option<u32> {
        mode(&self.global_loads)
    }

    pub fn main_global_store_bits(&self) -> Option<u32> {
        mode(&self.global_stores)
    }

    /// One line: `212 instructions; global loads 4 x 32-bit; ...`.
    pub fn one_line(&self) -> String {
        let widths = |m: &BTreeMap<u32, usize>| {
            m.iter()
                .rev()
                .map(|(b, n)| format!("{n} x {b}-bit"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = vec![format!("{} instructions", self.instructions)];
        if !self.global_loads.is_empty() {
            parts.push(format!("global loads {}", widths(&self.global_loads)));
        }
        if !self.global_stores.is_empty() {
            parts.push(format!("global stores {}", widths(&self.global_stores)));
        }
        if self.local_loads + self.local_stores > 0 {
            parts.push(format!(
                "local memory {} loads, {} stores",
                self.local_loads, self.local_stores
            ));
        }
        if !self.atomics.is_empty() {
            parts.push(format!("atomics {}", join_counts(&self.atomics)));
        }
        if self.barriers > 0 {
            parts.push(format!("{} barriers", self.barriers));
        }
        if self.tensor.is_empty() {
            parts.push("no tensor-core instructions".into());
        } else {
            parts.push(format!("tensor cores {}", join_counts(&self.tensor)));
        }
        parts.join("; ")
    }
}

fn join_counts(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn mode(m: &BTreeMap<u32, usize>) -> Option<u32> {
    // Most frequent; ties go to the narrower width (the one that limits).
    m.iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(b, _)| *b)
}

/// The class of a SASS opcode (the part before the first `.`).
pub fn sass_class(op: &str) -> &'static str {
    match op {
        "LDG" => "global load",
        "STG" => "global store",
        "LDS" | "LDSM" => "shared load",
        "STS" => "shared store",
        "LDL" => "local load",
        "STL" => "local store",
        "LD" | "ST" => "generic load/store",
        "LDGSTS" | "LDGDEPBAR" | "UBLKCP" | "UTMALDG" | "UTMASTG" | "UTMAPF" | "SYNCS" => {
            "asynchronous copy"
        }
        "ATOM" | "ATOMG" | "ATOMS" | "RED" | "REDG" => "atomic",
        "BAR" => "barrier",
        "MEMBAR" | "FENCE" | "ERRBAR" | "CCTL" | "CCTLL" => "memory fence",
        "SHFL" | "VOTE" | "VOTEU" | "REDUX" | "MATCH" | "WARPSYNC" => "warp",
        "HMMA" | "HGMMA" | "IMMA" | "IGMMA" | "QGMMA" | "BMMA" | "BGMMA" | "DMMA" | "WARPGROUP" => {
            "tensor"
        }
        "FADD" | "FMUL" | "FFMA" | "FMNMX" | "FSETP" | "FSEL" | "FSET" | "FCHK" | "FSWZADD"
        | "FADD2" | "FMUL2" | "FFMA2" => "fp32",
        "HADD2" | "HMUL2" | "HFMA2" | "HMNMX2" | "HSETP2" | "HSET2" => "fp16",
        "DADD" | "DMUL" | "DFMA" | "DSETP" | "DMNMX" => "fp64",
        "MUFU" => "special function",
        "F2F" | "F2I" | "I2F" | "F2FP" | "I2FP" | "FRND" | "F2IP" => "conversion",
        "BRA" | "BRX" | "JMP" | "JMX" | "CALL" | "RET" | "EXIT" | "BSSY" | "BSYNC" | "YIELD"
        | "NOP" | "BPT" | "KILL" | "NANOSLEEP" | "BREAK" | "ACQBULK" | "ELECT" => "control",
        "MOV" | "MOV32I" | "SEL" | "P2R" | "R2P" | "S2R" | "S2UR" | "CS2R" | "LDC" | "ULDC"
        | "UMOV" | "R2UR" | "PLOP3" | "PRMT" | "USEL" => "move",
        op if op.starts_with('I')
            || op.starts_with("LOP")
            || op.starts_with("SHF")
            || matches!(
                op,
                "LEA" | "POPC" | "FLO" | "BREV" | "BMSK" | "SGXT" | "VIADD" | "VIMNMX"
            ) =>
        {
            "integer"
        }
        op if op.starts_with('U') => "uniform",
        _ => "other",
    }
}

/// The width in bits a SASS memory instruction's modifiers give (`.128`, `.64`, `.U16`...);
/// 32 when none does.
pub fn sass_width(modifiers: &[&str]) -> u32 {
    for m in modifiers {
        match *m {
            "256" => return 256,
            "128" => return 128,
            "64" => return 64,
            "U16" | "S16" => return 16,
            "U8" | "S8" => return 8,
            _ => {}
        }
    }
    32
}

/// Summarises SASS as `cuobjdump -sass` or `nvdisasm` print it. Lines without an
/// instruction (headers, encodings, labels) are skipped.
pub fn summarize_sass(text: &str) -> CodeSummary {
    let mut s = CodeSummary {
        kind: "sass".into(),
        ..Default::default()
    };
    for line in text.lines() {
        let t = line.trim();
        if let Some(f) = t.strip_prefix("Function :") {
            push_unique(&mut s.functions, f.trim());
            continue;
        }
        if let Some(f) = t.strip_prefix(".global") {
            push_unique(&mut s.functions, f.trim());
            continue;
        }
        // `/*0140*/   @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x... */`
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let Some(end) = rest.find("*/") else { continue };
        let addr = &rest[..end];
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let body = rest[end + 2..].split(';').next().unwrap_or("").trim();
        let body = body.trim_start_matches('{').trim();
        let mut words = body.split_whitespace();
        let mut first = words.next().unwrap_or("");
        if first.starts_with('@') {
            first = words.next().unwrap_or("");
        }
        if first.is_empty() {
            continue;
        }
        let mut parts = first.split('.');
        let op = parts.next().unwrap_or("").to_string();
        let modifiers: Vec<&str> = parts.collect();
        count(&mut s, &op, sass_class(&op), sass_width(&modifiers));
    }
    s
}

fn push_unique(v: &mut Vec<String>, name: &str) {
    let name = name.trim_end_matches(|c: char| c == ',' || c.is_whitespace());
    if !name.is_empty() && !v.iter().any(|x| x == name) {
        v.push(name.to_string());
    }
}

fn count(s: &mut CodeSummary, op: &str, class: &str, width: u32) {
    s.instructions += 1;
    *s.classes.entry(class.to_string()).or_default() += 1;
    *s.opcodes.entry(op.to_string()).or_default() += 1;
    match class {
        "global load" => *s.global_loads.entry(width).or_default() += 1,
        "global store" => *s.global_stores.entry(width).or_default() += 1,
        "shared load" => *s.shared_loads.entry(width).or_default() += 1,
        "shared store" => *s.shared_stores.entry(width).or_default() += 1,
        "local load" => s.local_loads += 1,
        "local store" => s.local_stores += 1,
        "atomic" => *s.atomics.entry(op.to_string()).or_default() += 1,
        "barrier" => s.barriers += 1,
        "tensor" => *s.tensor.entry(op.to_string()).or_default() += 1,
        _ => {}
    }
}

/// The class of a PTX instruction from its opcode's parts (`ld.global.nc.v4.f32`).
fn ptx_class(parts: &[&str]) -> &'static str {
    let space = |s: &str| parts.contains(&s);
    match parts.first().copied().unwrap_or("") {
        "ld" | "ldu" if space("global") => "global load",
        "st" if space("global") => "global store",
        "ld" if space("shared") => "shared load",
        "st" if space("shared") => "shared store",
        "ld" if space("local") => "local load",
        "st" if space("local") => "local store",
        "ld" | "st" if space("param") || space("const") => "parameter/constant",
        "ld" | "st" | "ldu" => "generic load/store",
        "ldmatrix" => "shared load",
        "cp" | "cp.async" => "asynchronous copy",
        "atom" | "red" => "atomic",
        "bar" | "barrier" => "barrier",
        "membar" | "fence" => "memory fence",
        "shfl" | "vote" | "redux" | "match" => "warp",
        "mma" | "wmma" | "wgmma" => "tensor",
        "ex2" | "lg2" | "rsqrt" | "sqrt" | "rcp" | "sin" | "cos" | "tanh" => "special function",
        "cvt" | "cvta" => "conversion",
        "bra" | "ret" | "exit" | "call" | "brx" => "control",
        "mov" | "selp" => "move",
        "add" | "sub" | "mul" | "mad" | "fma" | "min" | "max" | "neg" | "abs" | "div" | "setp"
        | "set" => match parts.last().copied().unwrap_or("") {
            "f32" | "ftz" => "fp32",
            "f16" | "f16x2" | "bf16" | "bf16x2" => "fp16",
            "f64" => "fp64",
            _ => "integer",
        },
        "and" | "or" | "xor" | "not" | "shl" | "shr" | "popc" | "clz" | "brev" | "bfe" | "bfi"
        | "prmt" | "lop3" | "shf" => "integer",
        _ => "other",
    }
}

/// The width in bits of a PTX load or store: vector length times element size.
pub fn ptx_width(parts: &[&str]) -> u32 {
    let mut lanes = 1;
    let mut bits = 32;
    for p in parts {
        match *p {
            "v2" => lanes = 2,
            "v4" => lanes = 4,
            "v8" => lanes = 8,
            _ => {
                let digits: String = p.chars().skip(1).collect();
                if matches!(p.chars().next(), Some('f' | 'b' | 'u' | 's')) {
                    if let Ok(n) = digits.parse::<u32>() {
                        if matches!(n, 8 | 16 | 32 | 64 | 128) {
                            bits = n;
                        }
                    }
                }
            }
        }
    }
    lanes * bits
}

/// Summarises PTX text: instructions are the lines ending in `;` that are not directives.
pub fn summarize_ptx(text: &str) -> CodeSummary {
    let mut s = CodeSummary {
        kind: "ptx".into(),
        ..Default::default()
    };
    for line in text.lines() {
        let t = line.split("//").next().unwrap_or("").trim();
        if let Some(rest) = t
            .strip_prefix(".visible .entry")
            .or_else(|| t.strip_prefix(".entry"))
            .or_else(|| t.strip_prefix(".visible .func"))
            .or_else(|| t.strip_prefix(".func"))
        {
            let name = rest
                .trim()
                .trim_start_matches(|c: char| c == '(' || c.is_whitespace())
                .split(|c: char| c == '(' || c.is_whitespace())
                .find(|w| !w.is_empty() && !w.starts_with('.'))
                .unwrap_or("");
            push_unique(&mut s.functions, name);
            continue;
        }
        if t.is_empty() || t.starts_with('.') || t.starts_with('{') || t.starts_with('}') {
            continue;
        }
        if !t.ends_with(';') || t.ends_with(':') {
            continue;
        }
        let mut words = t.split_whitespace();
        let mut first = words.next().unwrap_or("");
        if first.starts_with('@') {
            first = words.next().unwrap_or("");
        }
        let first = first.trim_end_matches(';');
        if first.is_empty() || first.contains(':') {
            continue;
        }
        let parts: Vec<&str> = first.split('.').collect();
        let class = ptx_class(&parts);
        let op = if parts.len() > 1 && matches!(parts[0], "ld" | "st") {
            format!("{}.{}", parts[0], parts[1])
        } else {
            parts[0].to_string()
        };
        count(&mut s, &op, class, ptx_width(&parts));
    }
    s
}

/// SASS of a cubin, from `cuobjdump -sass`, else `nvdisasm`: the tool used and its text.
pub fn disassemble(
    cubin: &Path,
    cuobjdump: Option<&Path>,
    nvdisasm: Option<&Path>,
) -> Result<(PathBuf, String), String> {
    let mut tried = Vec::new();
    for (tool, args) in [
        (cuobjdump, vec!["-sass"]),
        (nvdisasm, vec!["--print-instruction-encoding=false"]),
    ] {
        let Some(tool) = tool else { continue };
        let out = Command::new(tool)
            .args(&args)
            .arg(cubin)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
        if out.status.success() {
            return Ok((
                tool.to_path_buf(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            ));
        }
        tried.push(format!(
            "{} failed: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Err(if tried.is_empty() {
        "neither cuobjdump nor nvdisasm was found".into()
    } else {
        tried.join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths() {
        assert_eq!(sass_width(&["E", "128", "CONSTANT"]), 128);
        assert_eq!(sass_width(&["E"]), 32);
        assert_eq!(sass_width(&["E", "U16"]), 16);
        assert_eq!(ptx_width(&["ld", "global", "nc", "v4", "f32"]), 128);
        assert_eq!(ptx_width(&["ld", "global", "u16"]), 16);
        assert_eq!(ptx_width(&["st", "global", "v2", "b32"]), 64);
        assert_eq!(sass_class("IMAD"), "integer");
        assert_eq!(sass_class("UIADD3"), "uniform");
        assert_eq!(sass_class("HGMMA"), "tensor");
    }
}
