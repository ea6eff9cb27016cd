//! The `a{sv}` options of `CreatePool` and `ResizePool`: they join the fixed arguments and are
//! decoded by serde into the same struct varlink's parameters are, each checked against the
//! D-Bus type its key takes.

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

/// The options D-Bus member `member` takes (none for a member without `a{sv}`).
pub fn options_of(member: &str) -> &'static [(&'static str, &'static str)] {
    match member {
        "CreatePool" => CREATE_OPTIONS,
        "ResizePool" => RESIZE_OPTIONS,
        _ => &[],
    }
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
