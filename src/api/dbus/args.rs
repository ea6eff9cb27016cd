//! D-Bus's arguments put into the table's parameter structs, so that the handlers decode
//! them as they decode varlink's: D-Bus has no optionals, so a size of 0 and an id of "" are
//! absent; and `CreatePool`'s and `ResizePool`'s `a{sv}` options join the fixed arguments and
//! are decoded by serde into the same struct varlink's parameters are.

use std::collections::HashMap;

use cpupool_wire::ApiError;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use zvariant::OwnedValue;

/// The options `CreatePool` takes, with their D-Bus types: the configuration file's keys.
pub const CREATE_OPTIONS: &[(&str, &str)] =
    &[("cpus", "s"), ("count", "u"), ("numa", "u"), ("smt", "s"), ("isolate", "b"), ("kubelet", "b")];
/// The options `ResizePool` takes: the CPU source.
pub const RESIZE_OPTIONS: &[(&str, &str)] = &[("cpus", "s"), ("count", "u"), ("numa", "u")];

/// `argument`'s value, `None` for 0 (absent); one beyond what the API takes (2^63-1) is refused
/// naming the argument, the value and the maximum.
pub fn nonzero<T: Default + PartialEq + Into<i128>>(argument: &str, v: T) -> Result<Option<i64>, ApiError> {
    if v == T::default() {
        return Ok(None);
    }
    let v = v.into();
    i64::try_from(v).map(Some).map_err(|_| {
        ApiError::invalid_argument(argument, &format!("{v} is more than the maximum, {}", i64::MAX))
    })
}

/// `id`, `None` when empty.
pub fn id(id: &str) -> Option<String> {
    Some(id).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// One option's value as JSON, if it has the D-Bus type `ty` (`u`: any integer type that fits
/// an `i64`).
fn json(ty: &str, value: &zvariant::Value<'_>) -> Option<Value> {
    use zvariant::Value as V;
    Some(match (ty, value) {
        ("u", V::U8(n)) => Value::from(*n),
        ("u", V::U16(n)) => Value::from(*n),
        ("u", V::I16(n)) => Value::from(*n),
        ("u", V::U32(n)) => Value::from(*n),
        ("u", V::I32(n)) => Value::from(*n),
        ("u", V::I64(n)) => Value::from(*n),
        ("u", V::U64(n)) => Value::from(i64::try_from(*n).ok()?),
        ("s", V::Str(s)) => Value::from(s.as_str()),
        ("b", V::Bool(b)) => Value::from(*b),
        _ => return None,
    })
}

/// The parameters `T` of `fixed` (the method's own arguments, by name) and `options`, each of
/// which must be one of `taken` (name and D-Bus type): an unknown option or one of another type
/// is `InvalidArgument` naming `options.<key>`.
pub fn with_options<T: DeserializeOwned>(
    mut fixed: Map<String, Value>,
    options: &HashMap<String, OwnedValue>,
    taken: &[(&str, &str)],
) -> Result<T, ApiError> {
    for (key, value) in options {
        let argument = format!("options.{key}");
        let Some(&(_, ty)) = taken.iter().find(|(name, _)| name == key) else {
            let names: Vec<&str> = taken.iter().map(|(name, _)| *name).collect();
            return Err(ApiError::invalid_argument(
                &argument,
                &format!("unknown option; the options are {}", names.join(", ")),
            ));
        };
        let value = json(ty, value)
            .ok_or_else(|| ApiError::invalid_argument(&argument, &format!("must be of type {ty}")))?;
        fixed.insert(key.clone(), value);
    }
    // Every value has the type its field takes, and every name is a field.
    serde_json::from_value(Value::Object(fixed))
        .map_err(|e| ApiError::invalid_argument("options", &e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use cpupool_wire::varlink::params;
    use serde_json::json;

    use super::*;

    #[test]
    fn zero_means_absent() {
        assert_eq!(nonzero("cpus", 0u32), Ok(None));
        assert_eq!(nonzero("cpus", 3u32), Ok(Some(3)));
        assert_eq!(nonzero("millicpus", i64::MAX as u64), Ok(Some(i64::MAX)));
        // What the caller sent, not 2^63-1.
        let e = nonzero("millicpus", u64::MAX).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(
            e,
            "invalid millicpus: 18446744073709551615 is more than the maximum, 9223372036854775807"
        );
    }

    #[test]
    fn options_decode_into_the_parameters_and_are_refused_by_name() {
        let fixed = |v: Value| v.as_object().cloned().unwrap();
        let options: HashMap<String, OwnedValue> =
            [("count".to_owned(), OwnedValue::from(4u32)), ("isolate".to_owned(), OwnedValue::from(true))]
                .into_iter()
                .collect();
        let p: params::CreatePool =
            with_options(fixed(json!({ "name": "p", "kind": "exclusive" })), &options, CREATE_OPTIONS)
                .unwrap();
        assert_eq!((p.count, p.isolate, p.cpus), (Some(4), Some(true), None));
        let refused = |key: &str, value: OwnedValue| {
            let options = [(key.to_owned(), value)].into_iter().collect();
            with_options::<params::ResizePool>(fixed(json!({ "name": "p" })), &options, RESIZE_OPTIONS)
                .unwrap_err()
                .message
        };
        assert_eq!(
            refused("colour", OwnedValue::from(1u32)),
            "invalid options.colour: unknown option; the options are cpus, count, numa"
        );
        assert_eq!(refused("isolate", OwnedValue::from(true)), refused("isolate", OwnedValue::from(false)));
        assert_eq!(refused("count", OwnedValue::from(true)), "invalid options.count: must be of type u");
        assert_eq!(refused("count", OwnedValue::from(u64::MAX)), "invalid options.count: must be of type u");
    }
}
