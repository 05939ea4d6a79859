//! The expression language of the annotation: integer arithmetic and conditions over a
//! kernel's scalar arguments and tunables.
//!
//! Lengths, launch geometry, byte and FLOP counts, constraints and shape regions are all
//! written in it. Tools and the runtime evaluate it the same way: a parsed [`Expr`] is
//! compiled to a flat prefix program of [`Op`]s and run by [`eval`], which needs no
//! allocation (the generated launcher embeds the programs as `&'static [Op]`).

use std::fmt;

use proc_macro2::Span;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use syn::spanned::Spanned;

/// A parsed expression. Variables are kept by name; [`Expr::compile`] binds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Int(i64),
    Var(String),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
    If(Box<Expr>, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Shl,
    Shr,
    BitAnd,
    BitOr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

/// Built-in functions. `a.div_ceil(b)`, `a.min(b)` and `a.max(b)` are accepted as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Min,
    Max,
    CeilDiv,
    RoundUp,
    NextPow2,
}

impl Func {
    pub const ALL: &'static [(&'static str, Func, usize)] = &[
        ("min", Func::Min, 2),
        ("max", Func::Max, 2),
        ("ceil_div", Func::CeilDiv, 2),
        ("div_ceil", Func::CeilDiv, 2),
        ("round_up", Func::RoundUp, 2),
        ("next_pow2", Func::NextPow2, 1),
    ];

    fn lookup(name: &str) -> Option<(Func, usize)> {
        Self::ALL
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, f, a)| (f, a))
    }

    fn name(self) -> &'static str {
        match self {
            Func::Min => "min",
            Func::Max => "max",
            Func::CeilDiv => "ceil_div",
            Func::RoundUp => "round_up",
            Func::NextPow2 => "next_pow2",
        }
    }
}

/// The type of an expression: the language has integers (i64) and booleans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Int,
    Bool,
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ty::Int => "an integer",
            Ty::Bool => "a condition",
        })
    }
}

/// What an identifier in an expression may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarKind {
    /// An integer scalar argument or tunable.
    Int,
    /// A floating-point scalar: it may not appear in integer expressions.
    Float,
}

/// Parses a `syn` expression into an [`Expr`], checking names and types.
///
/// `vars` says what each identifier is; `names_hint` lists the names for the error text.
pub fn from_syn(
    e: &syn::Expr,
    want: Ty,
    vars: &dyn Fn(&str) -> Option<VarKind>,
    names_hint: &[String],
) -> syn::Result<Expr> {
    let cx = Cx { vars, names_hint };
    let (expr, ty) = cx.convert(e)?;
    if ty != want {
        return Err(syn::Error::new(
            e.span(),
            format!(
                "expected {want} here, found {ty}{}",
                if want == Ty::Bool {
                    " (write a comparison such as `cols % 4 == 0`)"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(expr)
}

/// Parses expression text (as stored in variant files) with the same rules.
pub fn parse_str(
    text: &str,
    want: Ty,
    vars: &dyn Fn(&str) -> Option<VarKind>,
    names_hint: &[String],
) -> Result<Expr, String> {
    let e: syn::Expr = syn::parse_str(text).map_err(|e| format!("`{text}`: {e}"))?;
    from_syn(&e, want, vars, names_hint).map_err(|e| format!("`{text}`: {e}"))
}

struct Cx<'a> {
    vars: &'a dyn Fn(&str) -> Option<VarKind>,
    names_hint: &'a [String],
}

impl Cx<'_> {
    fn expect(&self, e: &syn::Expr, want: Ty) -> syn::Result<Expr> {
        let (x, ty) = self.convert(e)?;
        if ty != want {
            return Err(syn::Error::new(
                e.span(),
                format!("expected {want} here, found {ty}"),
            ));
        }
        Ok(x)
    }

    fn convert(&self, e: &syn::Expr) -> syn::Result<(Expr, Ty)> {
        use syn::Expr as S;
        match e {
            S::Lit(l) => match &l.lit {
                syn::Lit::Int(i) => Ok((Expr::Int(i.base10_parse::<i64>()?), Ty::Int)),
                syn::Lit::Bool(b) => Ok((Expr::Int(b.value as i64), Ty::Bool)),
                syn::Lit::Float(_) => Err(syn::Error::new(
                    l.span(),
                    "expressions here are integer arithmetic; a float literal is not allowed",
                )),
                _ => Err(syn::Error::new(l.span(), "expected an integer literal")),
            },
            S::Path(p) => {
                let Some(ident) = p.path.get_ident() else {
                    return Err(syn::Error::new(
                        p.span(),
                        "expected the name of a scalar argument or tunable",
                    ));
                };
                let name = ident.to_string();
                match (self.vars)(&name) {
                    Some(VarKind::Int) => Ok((Expr::Var(name), Ty::Int)),
                    Some(VarKind::Float) => Err(syn::Error::new(
                        ident.span(),
                        format!("`{name}` is a floating-point scalar; expressions here are integer arithmetic"),
                    )),
                    None => Err(syn::Error::new(
                        ident.span(),
                        unknown_name(&name, self.names_hint),
                    )),
                }
            }
            S::Paren(p) => self.convert(&p.expr),
            S::Group(g) => self.convert(&g.expr),
            S::Cast(c) => {
                let (x, ty) = self.convert(&c.expr)?;
                if ty != Ty::Int {
                    return Err(syn::Error::new(c.span(), "only integers can be cast"));
                }
                Ok((x, Ty::Int))
            }
            S::Unary(u) => match u.op {
                syn::UnOp::Neg(_) => {
                    let x = self.expect(&u.expr, Ty::Int)?;
                    Ok((Expr::Unary(UnOp::Neg, Box::new(x)), Ty::Int))
                }
                syn::UnOp::Not(_) => {
                    let x = self.expect(&u.expr, Ty::Bool)?;
                    Ok((Expr::Unary(UnOp::Not, Box::new(x)), Ty::Bool))
                }
                _ => Err(syn::Error::new(u.span(), "unsupported unary operator")),
            },
            S::Binary(b) => {
                use syn::BinOp as B;
                let (op, operand, result) = match b.op {
                    B::Add(_) => (BinOp::Add, Ty::Int, Ty::Int),
                    B::Sub(_) => (BinOp::Sub, Ty::Int, Ty::Int),
                    B::Mul(_) => (BinOp::Mul, Ty::Int, Ty::Int),
                    B::Div(_) => (BinOp::Div, Ty::Int, Ty::Int),
                    B::Rem(_) => (BinOp::Rem, Ty::Int, Ty::Int),
                    B::Shl(_) => (BinOp::Shl, Ty::Int, Ty::Int),
                    B::Shr(_) => (BinOp::Shr, Ty::Int, Ty::Int),
                    B::BitAnd(_) => (BinOp::BitAnd, Ty::Int, Ty::Int),
                    B::BitOr(_) => (BinOp::BitOr, Ty::Int, Ty::Int),
                    B::Eq(_) => (BinOp::Eq, Ty::Int, Ty::Bool),
                    B::Ne(_) => (BinOp::Ne, Ty::Int, Ty::Bool),
                    B::Lt(_) => (BinOp::Lt, Ty::Int, Ty::Bool),
                    B::Le(_) => (BinOp::Le, Ty::Int, Ty::Bool),
                    B::Gt(_) => (BinOp::Gt, Ty::Int, Ty::Bool),
                    B::Ge(_) => (BinOp::Ge, Ty::Int, Ty::Bool),
                    B::And(_) => (BinOp::And, Ty::Bool, Ty::Bool),
                    B::Or(_) => (BinOp::Or, Ty::Bool, Ty::Bool),
                    _ => {
                        return Err(syn::Error::new(
                            b.op.span(),
                            "unsupported operator (use + - * / % << >> & | == != < <= > >= && || !)",
                        ))
                    }
                };
                let l = self.expect(&b.left, operand)?;
                let r = self.expect(&b.right, operand)?;
                Ok((Expr::Binary(op, Box::new(l), Box::new(r)), result))
            }
            S::Call(c) => {
                let name = match &*c.func {
                    S::Path(p) => p.path.get_ident().map(|i| i.to_string()),
                    _ => None,
                };
                let Some(name) = name else {
                    return Err(syn::Error::new(c.func.span(), "expected a function name"));
                };
                self.call(&name, c.func.span(), c.args.iter().collect(), c.span())
            }
            S::MethodCall(m) => {
                let name = m.method.to_string();
                if !matches!(name.as_str(), "min" | "max" | "div_ceil") {
                    return Err(syn::Error::new(
                        m.method.span(),
                        "only `.min(x)`, `.max(x)` and `.div_ceil(x)` are supported as methods",
                    ));
                }
                let mut args = vec![&*m.receiver];
                args.extend(m.args.iter());
                self.call(&name, m.method.span(), args, m.span())
            }
            S::If(i) => {
                let c = self.expect(&i.cond, Ty::Bool)?;
                let then = block_expr(&i.then_branch)?;
                let Some((_, els)) = &i.else_branch else {
                    return Err(syn::Error::new(i.span(), "an `if` here needs an `else`"));
                };
                let els = match &**els {
                    S::Block(b) => block_expr(&b.block)?,
                    other => other,
                };
                let (t, tt) = self.convert(then)?;
                let e = self.expect(els, tt)?;
                Ok((Expr::If(Box::new(c), Box::new(t), Box::new(e)), tt))
            }
            S::Block(b) => self.convert(block_expr(&b.block)?),
            other => Err(syn::Error::new(
                other.span(),
                "not supported in a kopt expression: use integer literals, scalar arguments, tunables, arithmetic, comparisons, `if`/`else`, min/max/ceil_div/round_up/next_pow2",
            )),
        }
    }

    fn call(
        &self,
        name: &str,
        name_span: Span,
        args: Vec<&syn::Expr>,
        span: Span,
    ) -> syn::Result<(Expr, Ty)> {
        let Some((f, arity)) = Func::lookup(name) else {
            return Err(syn::Error::new(
                name_span,
                format!("unknown function `{name}`; available: min, max, ceil_div (div_ceil), round_up, next_pow2"),
            ));
        };
        if args.len() != arity {
            return Err(syn::Error::new(
                span,
                format!("`{name}` takes {arity} argument(s), found {}", args.len()),
            ));
        }
        let args = args
            .into_iter()
            .map(|a| self.expect(a, Ty::Int))
            .collect::<syn::Result<Vec<_>>>()?;
        Ok((Expr::Call(f, args), Ty::Int))
    }
}

fn block_expr(b: &syn::Block) -> syn::Result<&syn::Expr> {
    match b.stmts.as_slice() {
        [syn::Stmt::Expr(e, None)] => Ok(e),
        _ => Err(syn::Error::new(b.span(), "expected a single expression")),
    }
}

/// The error text for an unknown identifier, with the closest known name as a hint.
pub fn unknown_name(name: &str, known: &[String]) -> String {
    let mut msg = format!("unknown name `{name}`");
    if let Some(best) = closest(name, known) {
        msg.push_str(&format!("; did you mean `{best}`?"));
    } else if !known.is_empty() {
        msg.push_str(&format!("; known names: {}", known.join(", ")));
    } else {
        msg.push_str("; the kernel has no integer scalar arguments or tunables");
    }
    msg
}

/// The closest of `candidates` to `name` by edit distance, if it is close enough to be a typo.
pub fn closest<'a>(name: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= (c.len().max(name.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

// ---------------------------------------------------------------------------------------
// Printing: a canonical text form, stable across versions, used in files and hashes.

impl Expr {
    fn prec(&self) -> u8 {
        match self {
            Expr::Binary(op, ..) => op.prec(),
            Expr::If(..) => 0,
            Expr::Unary(..) => 12,
            _ => 13,
        }
    }

    /// Names of the variables the expression reads, in first-use order.
    pub fn vars(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.walk_vars(&mut out);
        out
    }

    /// This expression with every variable for which `with` gives an expression replaced
    /// by it (the replacement is not searched again).
    pub fn substitute(&self, with: &dyn Fn(&str) -> Option<Expr>) -> Expr {
        match self {
            Expr::Int(i) => Expr::Int(*i),
            Expr::Var(v) => with(v).unwrap_or_else(|| Expr::Var(v.clone())),
            Expr::Unary(op, x) => Expr::Unary(*op, Box::new(x.substitute(with))),
            Expr::Binary(op, a, b) => Expr::Binary(
                *op,
                Box::new(a.substitute(with)),
                Box::new(b.substitute(with)),
            ),
            Expr::Call(f, args) => {
                Expr::Call(*f, args.iter().map(|a| a.substitute(with)).collect())
            }
            Expr::If(c, t, e) => Expr::If(
                Box::new(c.substitute(with)),
                Box::new(t.substitute(with)),
                Box::new(e.substitute(with)),
            ),
        }
    }

    fn walk_vars<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Expr::Int(_) => {}
            Expr::Var(v) => {
                if !out.contains(&v.as_str()) {
                    out.push(v)
                }
            }
            Expr::Unary(_, x) => x.walk_vars(out),
            Expr::Binary(_, a, b) => {
                a.walk_vars(out);
                b.walk_vars(out)
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.walk_vars(out)),
            Expr::If(c, t, e) => {
                c.walk_vars(out);
                t.walk_vars(out);
                e.walk_vars(out)
            }
        }
    }
}

impl BinOp {
    fn prec(self) -> u8 {
        use BinOp::*;
        match self {
            Or => 1,
            And => 2,
            Eq | Ne | Lt | Le | Gt | Ge => 3,
            BitOr => 4,
            BitAnd => 6,
            Shl | Shr => 7,
            Add | Sub => 8,
            Mul | Div | Rem => 9,
        }
    }

    fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            Shl => "<<",
            Shr => ">>",
            BitAnd => "&",
            BitOr => "|",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            And => "&&",
            Or => "||",
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Int(i) if *i < 0 => write!(f, "({i})"),
            Expr::Int(i) => write!(f, "{i}"),
            Expr::Var(v) => f.write_str(v),
            Expr::Unary(op, x) => {
                f.write_str(match op {
                    UnOp::Neg => "-",
                    UnOp::Not => "!",
                })?;
                if x.prec() < 12 {
                    write!(f, "({x})")
                } else {
                    write!(f, "{x}")
                }
            }
            Expr::Binary(op, a, b) => {
                let p = op.prec();
                // Comparisons do not chain in Rust, so parenthesise equal precedence there.
                let cmp = p == 3;
                if a.prec() < p || (cmp && a.prec() == p) {
                    write!(f, "({a})")?
                } else {
                    write!(f, "{a}")?
                }
                write!(f, " {} ", op.symbol())?;
                if b.prec() <= p {
                    write!(f, "({b})")
                } else {
                    write!(f, "{b}")
                }
            }
            Expr::Call(func, args) => {
                write!(f, "{}(", func.name())?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
            Expr::If(c, t, e) => write!(f, "if {c} {{ {t} }} else {{ {e} }}"),
        }
    }
}

impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Expr {
    /// Deserialising checks syntax only; names and types are checked against a spec by
    /// the code that uses the expression.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let e: syn::Expr = syn::parse_str(&text).map_err(serde::de::Error::custom)?;
        let any = |_: &str| Some(VarKind::Int);
        let cx = Cx {
            vars: &any,
            names_hint: &[],
        };
        cx.convert(&e)
            .map(|(x, _)| x)
            .map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
    }
}

// ---------------------------------------------------------------------------------------
// Compiled form and evaluation.

/// One instruction of a compiled expression, in prefix order. Subtree lengths let `&&`,
/// `||` and `if` skip what they do not evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Int(i64),
    /// The value of variable number N (an index into the slice given to [`eval`]).
    Var(u16),
    Neg,
    Not,
    Bin(BinOp),
    /// `&&`: the right operand's length follows, so it can be skipped.
    And(u32),
    Or(u32),
    Call(Func),
    /// `if`: the lengths of the `then` and `else` subtrees.
    If(u32, u32),
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("division by zero")]
    DivByZero,
    #[error("integer overflow")]
    Overflow,
    #[error("shift amount out of range")]
    Shift,
    #[error("malformed expression program")]
    Malformed,
}

impl Expr {
    /// Compiles to a flat program; `slot` maps a variable name to its index in the value
    /// slice, or to a constant (a tunable's value substituted in).
    pub fn compile(&self, slot: &dyn Fn(&str) -> Option<Slot>) -> Result<Vec<Op>, String> {
        let mut out = Vec::new();
        self.emit(slot, &mut out)?;
        Ok(out)
    }

    fn emit(&self, slot: &dyn Fn(&str) -> Option<Slot>, out: &mut Vec<Op>) -> Result<(), String> {
        match self {
            Expr::Int(i) => out.push(Op::Int(*i)),
            Expr::Var(v) => match slot(v) {
                Some(Slot::Index(i)) => out.push(Op::Var(i)),
                Some(Slot::Const(c)) => out.push(Op::Int(c)),
                None => return Err(format!("unknown name `{v}`")),
            },
            Expr::Unary(op, x) => {
                out.push(match op {
                    UnOp::Neg => Op::Neg,
                    UnOp::Not => Op::Not,
                });
                x.emit(slot, out)?;
            }
            Expr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
                let at = out.len();
                out.push(Op::Int(0));
                a.emit(slot, out)?;
                let start = out.len();
                b.emit(slot, out)?;
                let len = (out.len() - start) as u32;
                out[at] = if *op == BinOp::And {
                    Op::And(len)
                } else {
                    Op::Or(len)
                };
            }
            Expr::Binary(op, a, b) => {
                out.push(Op::Bin(*op));
                a.emit(slot, out)?;
                b.emit(slot, out)?;
            }
            Expr::Call(f, args) => {
                out.push(Op::Call(*f));
                for a in args {
                    a.emit(slot, out)?;
                }
            }
            Expr::If(c, t, e) => {
                let at = out.len();
                out.push(Op::Int(0));
                c.emit(slot, out)?;
                let t0 = out.len();
                t.emit(slot, out)?;
                let e0 = out.len();
                e.emit(slot, out)?;
                out[at] = Op::If((e0 - t0) as u32, (out.len() - e0) as u32);
            }
        }
        Ok(())
    }

    /// Compiles with `names[i]` bound to index i and evaluates: the convenience used by
    /// tools, which hold values by name.
    pub fn eval_named(&self, values: &[(&str, i64)]) -> Result<i64, String> {
        let names: Vec<&str> = values.iter().map(|(n, _)| *n).collect();
        let vals: Vec<i64> = values.iter().map(|(_, v)| *v).collect();
        let prog = self.compile(&|n| {
            names
                .iter()
                .position(|m| *m == n)
                .map(|i| Slot::Index(i as u16))
        })?;
        eval(&prog, &vals).map_err(|e| format!("`{self}`: {e}"))
    }
}

/// Where a variable's value comes from when compiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Index(u16),
    Const(i64),
}

/// Evaluates a compiled program over `vars`. Booleans are 0 and 1. Never allocates.
pub fn eval(prog: &[Op], vars: &[i64]) -> Result<i64, EvalError> {
    let (v, end) = eval_at(prog, 0, vars)?;
    if end != prog.len() {
        return Err(EvalError::Malformed);
    }
    Ok(v)
}

fn eval_at(p: &[Op], pc: usize, vars: &[i64]) -> Result<(i64, usize), EvalError> {
    let op = *p.get(pc).ok_or(EvalError::Malformed)?;
    let pc = pc + 1;
    Ok(match op {
        Op::Int(i) => (i, pc),
        Op::Var(i) => (*vars.get(i as usize).ok_or(EvalError::Malformed)?, pc),
        Op::Neg => {
            let (x, pc) = eval_at(p, pc, vars)?;
            (x.checked_neg().ok_or(EvalError::Overflow)?, pc)
        }
        Op::Not => {
            let (x, pc) = eval_at(p, pc, vars)?;
            ((x == 0) as i64, pc)
        }
        Op::And(len) => {
            let (a, pc) = eval_at(p, pc, vars)?;
            if a == 0 {
                (0, pc + len as usize)
            } else {
                let (b, pc) = eval_at(p, pc, vars)?;
                ((b != 0) as i64, pc)
            }
        }
        Op::Or(len) => {
            let (a, pc) = eval_at(p, pc, vars)?;
            if a != 0 {
                (1, pc + len as usize)
            } else {
                let (b, pc) = eval_at(p, pc, vars)?;
                ((b != 0) as i64, pc)
            }
        }
        Op::If(tlen, elen) => {
            let (c, pc) = eval_at(p, pc, vars)?;
            if c != 0 {
                let (v, pc) = eval_at(p, pc, vars)?;
                (v, pc + elen as usize)
            } else {
                eval_at(p, pc + tlen as usize, vars)?
            }
        }
        Op::Bin(op) => {
            let (a, pc) = eval_at(p, pc, vars)?;
            let (b, pc) = eval_at(p, pc, vars)?;
            (binary(op, a, b)?, pc)
        }
        Op::Call(f) => {
            let (a, pc) = eval_at(p, pc, vars)?;
            if f == Func::NextPow2 {
                let v = if a <= 1 {
                    1
                } else {
                    (a as u64)
                        .checked_next_power_of_two()
                        .filter(|v| *v <= i64::MAX as u64)
                        .ok_or(EvalError::Overflow)? as i64
                };
                return Ok((v, pc));
            }
            let (b, pc) = eval_at(p, pc, vars)?;
            let v = match f {
                Func::Min => a.min(b),
                Func::Max => a.max(b),
                Func::CeilDiv => ceil_div(a, b)?,
                Func::RoundUp => ceil_div(a, b)?.checked_mul(b).ok_or(EvalError::Overflow)?,
                Func::NextPow2 => unreachable!("handled above"),
            };
            (v, pc)
        }
    })
}

fn ceil_div(a: i64, b: i64) -> Result<i64, EvalError> {
    if b == 0 {
        return Err(EvalError::DivByZero);
    }
    let q = a / b;
    Ok(if (a % b != 0) && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    })
}

fn binary(op: BinOp, a: i64, b: i64) -> Result<i64, EvalError> {
    use BinOp::*;
    let o = EvalError::Overflow;
    Ok(match op {
        Add => a.checked_add(b).ok_or(o)?,
        Sub => a.checked_sub(b).ok_or(o)?,
        Mul => a.checked_mul(b).ok_or(o)?,
        Div => {
            if b == 0 {
                return Err(EvalError::DivByZero);
            }
            a.checked_div(b).ok_or(o)?
        }
        Rem => {
            if b == 0 {
                return Err(EvalError::DivByZero);
            }
            a.checked_rem(b).ok_or(o)?
        }
        Shl => {
            let s = u32::try_from(b).map_err(|_| EvalError::Shift)?;
            a.checked_shl(s).ok_or(EvalError::Shift)?
        }
        Shr => {
            let s = u32::try_from(b).map_err(|_| EvalError::Shift)?;
            a.checked_shr(s).ok_or(EvalError::Shift)?
        }
        BitAnd => a & b,
        BitOr => a | b,
        Eq => (a == b) as i64,
        Ne => (a != b) as i64,
        Lt => (a < b) as i64,
        Le => (a <= b) as i64,
        Gt => (a > b) as i64,
        Ge => (a >= b) as i64,
        And => ((a != 0) && (b != 0)) as i64,
        Or => ((a != 0) || (b != 0)) as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, want: Ty) -> Result<Expr, String> {
        let names: Vec<String> = ["rows", "cols", "BLOCK"].map(String::from).to_vec();
        let vars = |n: &str| match n {
            "rows" | "cols" | "BLOCK" => Some(VarKind::Int),
            "eps" => Some(VarKind::Float),
            _ => None,
        };
        parse_str(text, want, &vars, &names)
    }

    fn run(text: &str, rows: i64, cols: i64) -> Result<i64, String> {
        let e = parse(text, Ty::Int).or_else(|_| parse(text, Ty::Bool))?;
        e.eval_named(&[("rows", rows), ("cols", cols), ("BLOCK", 256)])
    }

    #[test]
    fn arithmetic_and_functions() {
        assert_eq!(run("rows * cols * 4", 3, 5), Ok(60));
        assert_eq!(run("ceil_div(cols, BLOCK)", 1, 257), Ok(2));
        assert_eq!(run("cols.div_ceil(256) as u32", 1, 512), Ok(2));
        assert_eq!(run("min(rows, 8).max(2)", 1, 0), Ok(2));
        assert_eq!(run("round_up(cols, 32)", 0, 33), Ok(64));
        assert_eq!(run("next_pow2(cols)", 0, 33), Ok(64));
        assert_eq!(
            run("if cols > 1024 { 1024 } else { cols }", 0, 5000),
            Ok(1024)
        );
        assert_eq!(run("1 << 4 | 1", 0, 0), Ok(17));
        assert_eq!(run("-rows + 1", 5, 0), Ok(-4));
    }

    #[test]
    fn conditions_short_circuit() {
        assert_eq!(run("cols != 0 && rows / cols > 2", 10, 0), Ok(0));
        assert_eq!(run("cols == 0 || rows / cols > 2", 10, 0), Ok(1));
        assert_eq!(run("rows >= 64 && cols % 4 == 0", 64, 8), Ok(1));
        assert_eq!(run("!(rows >= 64)", 64, 8), Ok(0));
        assert_eq!(
            run("rows / cols", 1, 0),
            Err("`rows / cols`: division by zero".into())
        );
        assert_eq!(run("if cols == 0 { 0 } else { rows / cols }", 1, 0), Ok(0));
    }

    #[test]
    fn type_and_name_errors() {
        assert!(parse("rows + cols", Ty::Bool)
            .unwrap_err()
            .contains("expected a condition"));
        assert!(parse("rows && cols", Ty::Bool)
            .unwrap_err()
            .contains("expected a condition"));
        assert!(parse("rowz * 2", Ty::Int)
            .unwrap_err()
            .contains("did you mean `rows`"));
        assert!(parse("eps * 2", Ty::Int)
            .unwrap_err()
            .contains("floating-point"));
        assert!(parse("1.5 * rows", Ty::Int)
            .unwrap_err()
            .contains("float literal"));
        assert!(parse("foo(rows)", Ty::Int)
            .unwrap_err()
            .contains("unknown function"));
    }

    #[test]
    fn printing_round_trips_and_is_canonical() {
        for text in [
            "rows * cols * 4",
            "(rows + 1) * cols",
            "rows - (cols - 1)",
            "rows >= 64 && cols % 4 == 0",
            "rows & 3 == 0",
            "if rows > 2 { ceil_div(cols, 4) } else { 1 }",
            "!(rows > 2) || cols < 5",
            "-3 + rows",
        ] {
            let e = parse(text, Ty::Int)
                .or_else(|_| parse(text, Ty::Bool))
                .unwrap();
            let printed = e.to_string();
            assert_eq!(printed, text, "canonical form");
            let again = parse(&printed, Ty::Int)
                .or_else(|_| parse(&printed, Ty::Bool))
                .unwrap();
            assert_eq!(again, e);
        }
        // Redundant parentheses and casts are dropped.
        let e = parse("((rows)) * (cols as u32)", Ty::Int).unwrap();
        assert_eq!(e.to_string(), "rows * cols");
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert_eq!(
            run("rows * rows", i64::MAX / 2, 0),
            Err("`rows * rows`: integer overflow".into())
        );
    }
}
