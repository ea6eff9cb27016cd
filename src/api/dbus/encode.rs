//! A D-Bus call's arguments as the table's parameter struct, and a reply view as the reply's
//! arguments, read from the introspection XML ([`cpupool_wire::dbus::member`]) rather than
//! written per method.
//!
//! Data flow in: the body's values, named by the member's `in` arguments, become a JSON object
//! that serde decodes into the method's parameters. D-Bus has no optionals: an argument that
//! carries an optional parameter (one the struct's `Default` leaves out) is absent when it is
//! `""` or `0`; an `a{sv}` argument joins its options to the others ([`args::with_options`]).
//!
//! Data flow out: the reply view, serialized (its fields in declaration order), becomes one
//! value per `out` argument, the field of the same name in the argument's signature: a view
//! nested in it is a D-Bus structure of its fields in order, an absent string is `""`, a count
//! beyond `u` is `u32::MAX`. A reply of one structure (`GetPool`'s `(ssssttbus)`) is sent as
//! the structure's fields, as the daemon always has. The one view whose structure is not its fields in order,
//! `ClassSetting`, has a slot fewer than fields: its `state` carries the reason after `: `.

use std::collections::HashMap;

use cpupool_wire::dbus::Member;
use cpupool_wire::ApiError;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};
use zvariant::{Array, OwnedValue, Signature, Structure, StructureBuilder, Value as Variant};

use super::args;

/// The parameters `P` of a call of `member` whose body holds `values`.
pub fn params<P: Serialize + serde::de::DeserializeOwned + Default>(
    member: &Member,
    values: &[Variant<'_>],
) -> Result<P, ApiError> {
    let required = match serde_json::to_value(P::default()) {
        Ok(Value::Object(fields)) => fields,
        _ => Map::new(),
    };
    let mut given = Map::new();
    let mut options = None;
    for (arg, value) in member.ins.iter().zip(values) {
        let json = match value {
            Variant::Str(s) => Value::from(s.as_str()),
            Variant::U32(n) => Value::from(*n),
            Variant::U64(n) => Value::from(i64::try_from(*n).map_err(|_| {
                ApiError::invalid_argument(arg.name, &format!("{n} is more than the maximum, {}", i64::MAX))
            })?),
            Variant::Bool(b) => Value::from(*b),
            Variant::Dict(d) => {
                options =
                    Some(options_map(d).map_err(|e| ApiError::invalid_argument(arg.name, &e.to_string()))?);
                continue;
            }
            other => return Err(ApiError::invalid_argument(arg.name, &format!("unexpected {other}"))),
        };
        // An optional parameter given as "" or 0 is absent.
        let zero = json.as_str() == Some("") || json.as_u64() == Some(0);
        if !zero || required.contains_key(arg.name) {
            given.insert(arg.name.to_owned(), json);
        }
    }
    match options {
        Some(options) => args::with_options(given, &options, args::options_of(member.name)),
        None => serde_json::from_value(Value::Object(given))
            .map_err(|e| ApiError::invalid_argument("arguments", &e.to_string())),
    }
}

/// An `a{sv}` argument's options by key, each the value inside its variant.
fn options_map(dict: &zvariant::Dict<'_, '_>) -> zvariant::Result<HashMap<String, OwnedValue>> {
    dict.iter()
        .map(|(key, value)| {
            let key = key.downcast_ref::<&str>()?.to_owned();
            let inner = match value {
                Variant::Value(inner) => inner.as_ref(),
                other => other,
            };
            Ok((key, OwnedValue::try_from(inner.try_clone()?)?))
        })
        .collect()
}

/// Why a reply view has no D-Bus form.
#[derive(Debug, PartialEq, Eq)]
pub enum Unencodable {
    /// The view lacks the structure argument `.0` must carry (an edited pool that is gone).
    Missing(&'static str),
    /// The view does not have the shape of the XML's arguments (a daemon bug).
    Shape(String),
}

/// The reply of `member` carrying `reply`: its `out` arguments, or none.
pub fn reply(member: &Member, reply: &impl Serialize) -> Result<Option<Structure<'static>>, Unencodable> {
    if member.outs.is_empty() {
        return Ok(None);
    }
    let shape = |e: String| Unencodable::Shape(format!("{}: {e}", member.name));
    let text = serde_json::to_vec(reply).map_err(|e| shape(e.to_string()))?;
    let Tree::Map(fields) = serde_json::from_slice(&text).map_err(|e| shape(e.to_string()))? else {
        return Err(shape("not a struct".into()));
    };
    let mut body = Vec::new();
    for arg in &member.outs {
        let field = fields.iter().find(|(name, _)| name == arg.name).map_or(&Tree::Null, |(_, v)| v);
        let signature = Signature::try_from(arg.signature).map_err(|e| shape(e.to_string()))?;
        if matches!((&signature, field), (Signature::Structure(_), Tree::Null)) {
            return Err(Unencodable::Missing(arg.name));
        }
        body.push(value(&signature, field).map_err(|e| shape(format!("{}: {e}", arg.name)))?);
    }
    match <[_; 1]>::try_from(body) {
        // One structure goes as its fields, as zbus sends a returned tuple (and the daemon
        // always has); clients read either form.
        Ok([Variant::Structure(one)]) => Ok(Some(one)),
        Ok([one]) => StructureBuilder::new().append_field(one).build().map(Some),
        Err(body) => {
            body.into_iter().fold(StructureBuilder::new(), StructureBuilder::append_field).build().map(Some)
        }
    }
    .map_err(|e| shape(e.to_string()))
}

/// `t` as a value of signature `signature`.
fn value(signature: &Signature, t: &Tree) -> Result<Variant<'static>, String> {
    let wrong = || format!("{t:?} is not of type {signature}");
    Ok(match (signature, t) {
        (Signature::Str, Tree::Str(s)) => Variant::from(s.clone()),
        (Signature::Str, Tree::Null) => Variant::from(String::new()),
        (Signature::Bool, Tree::Bool(b)) => Variant::from(*b),
        (Signature::U32, Tree::U64(n)) => Variant::from(u32::try_from(*n).unwrap_or(u32::MAX)),
        (Signature::U64, Tree::U64(n)) => Variant::from(*n),
        (Signature::F64, Tree::F64(n)) => Variant::from(*n),
        (Signature::F64, Tree::U64(n)) => Variant::from(*n as f64),
        (Signature::F64, Tree::I64(n)) => Variant::from(*n as f64),
        (Signature::Array(element), Tree::Seq(items)) => {
            let mut array = Array::new(element);
            for item in items {
                array.append(value(element, item)?).map_err(|e| e.to_string())?;
            }
            Variant::from(array)
        }
        (Signature::Structure(slots), Tree::Map(fields)) => {
            let fields = folded(fields, slots.iter().count());
            if fields.len() != slots.iter().count() {
                return Err(wrong());
            }
            let mut s = StructureBuilder::new();
            for (slot, field) in slots.iter().zip(fields) {
                s = s.append_field(value(slot, &field)?);
            }
            Variant::from(s.build().map_err(|e| e.to_string())?)
        }
        _ => return Err(wrong()),
    })
}

/// A view's fields for a structure of `slots`: as they are, or, with one fewer slot than
/// fields, `reason` joined to `state` after `: ` when not empty (`ClassSetting`'s D-Bus form).
fn folded(fields: &[(String, Tree)], slots: usize) -> Vec<Tree> {
    let mut fields = fields.to_vec();
    if fields.len() == slots + 1 {
        let reason = fields.iter().position(|(name, _)| name == "reason").map(|i| fields.remove(i).1);
        let state = fields.iter_mut().find(|(name, _)| name == "state");
        if let (Some(Tree::Str(reason)), Some((_, Tree::Str(state)))) = (reason, state) {
            if !reason.is_empty() {
                *state = format!("{state}: {reason}");
            }
        }
    }
    fields.into_iter().map(|(_, v)| v).collect()
}

/// A serialized view, its objects' fields in the order written (serde writes a struct's fields
/// in declaration order; `serde_json::Value` would sort them).
#[derive(Debug, Clone, PartialEq)]
enum Tree {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(String),
    Seq(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Tree, E> {
        Ok(Tree::U64(n))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Tree, E> {
        Ok(u64::try_from(n).map_or(Tree::I64(n), Tree::U64))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Tree, E> {
        Ok(Tree::F64(n))
    }

    fn visit_str<E>(self, s: &str) -> Result<Tree, E> {
        Ok(Tree::Str(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Tree, E> {
        Ok(Tree::Str(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut fields = Vec::new();
        while let Some(field) = map.next_entry()? {
            fields.push(field);
        }
        Ok(Tree::Map(fields))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use cpupool_wire::dbus::{member, PoolStruct};
    use cpupool_wire::methods::{self as m, Method};
    use cpupool_wire::varlink::params;
    use cpupool_wire::views;

    use super::*;

    fn pool() -> views::Pool {
        views::Pool {
            name: "dp".into(),
            kind: "exclusive".into(),
            cpus: "2-3".into(),
            free_cpus: "3".into(),
            free_millicpus: 1000,
            capacity_millicpus: 2000,
            isolated: true,
            assignments: 1,
            partition: "isolated".into(),
        }
    }

    /// The body `reply` gives `M`'s first D-Bus member, decoded as `T`.
    fn sent<M: Method, T>(reply: &M::Reply) -> T
    where
        T: for<'d> zvariant::DynamicDeserialize<'d>,
    {
        let body = super::reply(&member(M::ID.dbus()[0]).unwrap(), reply).unwrap().unwrap();
        let msg = zbus::Message::method_call("/", "X").unwrap().build(&body).unwrap();
        msg.body().deserialize::<T>().unwrap()
    }

    #[test]
    fn replies_are_the_xmls_structures() {
        let p: PoolStruct = sent::<m::GetPool, _>(&views::PoolReply { pool: Some(pool()) });
        assert_eq!(p, pool().into());
        let pools: Vec<PoolStruct> = sent::<m::ListPools, _>(&views::Pools { pools: vec![pool()] });
        assert_eq!(pools, vec![pool().into()]);
        let none: Vec<PoolStruct> = sent::<m::ListPools, _>(&views::Pools { pools: vec![] });
        assert!(none.is_empty());
        let status = views::Status {
            version: "1".into(),
            uptime_seconds: 5,
            pools: 2,
            assignments: u64::MAX,
            state_file: "/s".into(),
            config_error: None,
            degraded_assignments: 0,
            containers: Some("NRI".into()),
        };
        let st: (String, u64, u32, u32, String, String, u32) = sent::<m::Status, _>(&status);
        assert_eq!(st, ("1".into(), 5, 2, u32::MAX, "/s".into(), String::new(), 0));
        let class = views::ClassSetting {
            pool: "p".into(),
            class: "power".into(),
            key: "governor".into(),
            wanted: "performance".into(),
            in_force: "powersave".into(),
            scope: "2-3".into(),
            state: "degraded".into(),
            reason: "EBUSY".into(),
        };
        let classes: Vec<(String, String, String, String, String, String, String)> =
            sent::<m::GetClasses, _>(&views::Classes { classes: vec![class] });
        assert_eq!(classes[0].6, "degraded: EBUSY");
        assert_eq!(classes[0].5, "2-3");
        let reloaded = views::Reloaded { changed: true, summary: "1 key changed: pools.dp.cache.l3".into() };
        let (changed, summary): (bool, String) = sent::<m::Reload, _>(&reloaded);
        assert!(changed);
        assert_eq!(summary, reloaded.summary);
        let nothing = super::reply(&member("DeletePool").unwrap(), &views::Nothing {});
        assert_eq!(nothing.ok().flatten().map(|s| s.fields().len()), None);
        let gone = super::reply(&member("CreatePool").unwrap(), &views::PoolReply { pool: None });
        assert_eq!(gone.err(), Some(Unencodable::Missing("pool")));
    }

    #[test]
    fn arguments_are_the_parameters_and_zero_is_absent_only_for_optionals() {
        let s = |v: &str| Variant::from(v.to_owned());
        let assign = member("AssignEx").unwrap();
        let args = [s("web"), s("unit:a"), Variant::U32(0), Variant::U64(250), s(""), Variant::Bool(false)];
        let p: params::Assign = params(&assign, &args).unwrap();
        assert_eq!(
            p,
            params::Assign {
                pool: "web".into(),
                target: "unit:a".into(),
                cpus: None,
                millicpus: Some(250),
                id: None,
                reclaim: Some(false),
            }
        );
        // A required parameter keeps its "".
        let p: params::GetPool = params(&member("GetPool").unwrap(), &[s("")]).unwrap();
        assert_eq!(p.name, "");
        let p: params::GetClasses = params(&member("GetClasses").unwrap(), &[s("")]).unwrap();
        assert_eq!(p.pool, None);
        let e = params::<params::Assign>(
            &member("Assign").unwrap(),
            &[s("w"), s("t"), Variant::U32(0), Variant::U64(u64::MAX), s("")],
        );
        assert_eq!(
            e.err().map(|e| e.message).unwrap_or_default(),
            "invalid millicpus: 18446744073709551615 is more than the maximum, 9223372036854775807"
        );
    }
}
