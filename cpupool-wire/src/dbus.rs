//! The D-Bus interface as shipped: `dbus/org.cpupool.Manager1.xml` (installed to
//! `/usr/share/dbus-1/interfaces/` by the packages, and served by the daemon; a test keeps
//! the two equal).
//!
//! The daemon and its clients read each method's arguments from it ([`member`]): a call's
//! arguments are the fields of the same names of the table's parameter struct, a reply's
//! arguments those of its reply view, and a D-Bus structure is a view's fields in order; only
//! `ClassSetting`'s differs (its state carries the reason after `: `). The two tuple types
//! below are what the daemon keeps ready: the `Pools` property, the shared `ListAssignments`
//! lists.

use serde::Deserialize;

use crate::views::{Assignment, ClassSetting, Pool};

/// The introspection XML of `org.cpupool.Manager1`.
pub const INTROSPECTION_XML: &str = include_str!("../../dbus/org.cpupool.Manager1.xml");

/// One argument of a method of the XML: its name and D-Bus signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    /// Its name (`pool`), the name of the field it carries in the table's parameter or reply
    /// struct.
    pub name: &'static str,
    /// Its signature (`s`, `a(ssssttbus)`).
    pub signature: &'static str,
}

/// A method as the XML declares it: what a call carries and what its reply does, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its name (`AssignEx`).
    pub name: &'static str,
    /// The arguments of a call.
    pub ins: Vec<Arg>,
    /// The arguments of its reply.
    pub outs: Vec<Arg>,
}

/// The value of attribute `key` in the tag `tag` (`<arg name="x" ...`).
fn attribute(tag: &'static str, key: &str) -> Option<&'static str> {
    let start = tag.find(&format!(" {key}=\""))? + key.len() + 3;
    let rest = &tag[start..];
    Some(&rest[..rest.find('"')?])
}

/// The method called `name` in [`INTROSPECTION_XML`]: a client puts a call's parameters into
/// its `ins` by name, and reads a reply's fields from its `outs` by name.
pub fn member(name: &str) -> Option<Member> {
    let open = format!("<method name=\"{name}\">");
    let start = INTROSPECTION_XML.find(&open)? + open.len();
    let body = &INTROSPECTION_XML[start..];
    let body = &body[..body.find("</method>")?];
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for tag in body.split("<arg").skip(1) {
        let tag = &tag[..tag.find("/>")?];
        let arg = Arg { name: attribute(tag, "name")?, signature: attribute(tag, "type")? };
        match attribute(tag, "direction")? {
            "in" => ins.push(arg),
            _ => outs.push(arg),
        }
    }
    let name = &INTROSPECTION_XML[start - open.len() + 14..start - 2];
    Some(Member { name, ins, outs })
}

/// A [`ClassSetting`] as either transport sends it, decoded: varlink's object of eight
/// fields, or D-Bus's `(sssssss)` whose `state` carries the reason after `: `.
#[derive(Deserialize)]
pub(crate) struct ClassRow {
    pool: String,
    class: String,
    key: String,
    wanted: String,
    in_force: String,
    scope: String,
    state: String,
    #[serde(default)]
    reason: String,
}

impl From<ClassRow> for ClassSetting {
    fn from(r: ClassRow) -> ClassSetting {
        let ClassRow { pool, class, key, wanted, in_force, scope, state, reason } = r;
        let (state, reason) = match state.split_once(": ") {
            Some((s, r)) if reason.is_empty() => (s.to_owned(), r.to_owned()),
            _ => (state, reason),
        };
        ClassSetting { pool, class, key, wanted, in_force, scope, state, reason }
    }
}

/// A [`Pool`] as D-Bus carries it, `(ssssttbus)`: name, kind, cpus, free_cpus,
/// free_millicpus, capacity_millicpus, isolated, assignments, partition.
pub type PoolStruct = (String, String, String, String, u64, u64, bool, u32, String);
/// An [`Assignment`] as D-Bus carries it, `(ssstsbsss)`: id, pool, cpus, millicpus, target,
/// reclaim, container, state, reason.
pub type AssignmentStruct = (String, String, String, u64, String, bool, String, String, String);
impl From<Pool> for PoolStruct {
    fn from(p: Pool) -> PoolStruct {
        let Pool {
            name,
            kind,
            cpus,
            free_cpus,
            free_millicpus,
            capacity_millicpus,
            isolated,
            assignments,
            partition,
        } = p;
        (name, kind, cpus, free_cpus, free_millicpus, capacity_millicpus, isolated, assignments, partition)
    }
}

impl From<Assignment> for AssignmentStruct {
    fn from(a: Assignment) -> AssignmentStruct {
        let Assignment { id, pool, cpus, millicpus, target, reclaim, container, state, reason } = a;
        (id, pool, cpus, millicpus, target, reclaim, container, state, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::MethodId;

    #[test]
    fn members_are_read_from_the_xml() {
        let names = |args: &[Arg]| args.iter().map(|a| a.name).collect::<Vec<_>>();
        let ex = member("AssignEx").unwrap_or_else(|| panic!("AssignEx"));
        assert_eq!(ex.name, "AssignEx");
        assert_eq!(names(&ex.ins), ["pool", "target", "cpus", "millicpus", "id", "reclaim"]);
        assert_eq!(ex.outs, [Arg { name: "assignment", signature: "(ssstsbsss)" }]);
        assert!(member("DeletePool").is_some_and(|m| m.outs.is_empty()));
        assert_eq!(member("Nope"), None);
        for m in MethodId::ALL {
            for d in m.dbus() {
                assert!(member(d).is_some(), "{d}");
            }
        }
    }

    #[test]
    fn a_class_setting_decodes_from_either_form() {
        let row = ["p", "power", "governor", "performance", "powersave", "2-3", "degraded: EBUSY"];
        let c: ClassSetting =
            serde_json::from_value(serde_json::json!(row)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.state.as_str(), c.reason.as_str()), ("degraded", "EBUSY"));
        let json = serde_json::to_value(&c).unwrap_or_default();
        assert_eq!(serde_json::from_value::<ClassSetting>(json).ok(), Some(c));
    }
}
