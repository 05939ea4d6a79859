//! JSON has no NaN or infinity, and a localised numeric failure is often exactly that:
//! non-finite floats are written as the strings "NaN", "inf" and "-inf".

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Num(f64),
    Text(String),
}

fn to_repr(v: f64) -> Repr {
    if v.is_nan() {
        Repr::Text("NaN".into())
    } else if v.is_infinite() {
        Repr::Text(if v > 0.0 { "inf" } else { "-inf" }.into())
    } else {
        Repr::Num(v)
    }
}

fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
    match r {
        Repr::Num(v) => Ok(v),
        Repr::Text(t) => match t.as_str() {
            "NaN" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(E::custom(format!("not a number: {other}"))),
        },
    }
}

pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    to_repr(*v).serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    from_repr(Repr::deserialize(d)?)
}

/// For `Vec<(u64, f64, f64)>` (index, got, want).
pub mod triples {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[(u64, f64, f64)], s: S) -> Result<S::Ok, S::Error> {
        let r: Vec<(u64, Repr, Repr)> = v
            .iter()
            .map(|&(i, a, b)| (i, to_repr(a), to_repr(b)))
            .collect();
        r.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, f64, f64)>, D::Error> {
        let r: Vec<(u64, Repr, Repr)> = Vec::deserialize(d)?;
        r.into_iter()
            .map(|(i, a, b)| Ok((i, from_repr(a)?, from_repr(b)?)))
            .collect()
    }
}

/// For `Option<f64>`: `None` as null (or absent, with `#[serde(default)]`).
pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(to_repr).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<Repr>::deserialize(d)?.map(from_repr).transpose()
    }
}
