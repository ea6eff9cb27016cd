//! Bad input on the management interfaces: garbage CPU lists, huge numbers, unknown pools, zero
//! and negative sizes, over-long names, path traversal in cgroup and unit targets, NUL bytes
//! and non-UTF-8. Each call must get its typed error naming the argument at fault (varlink
//! `InvalidArgument {argument}`, D-Bus `...Error.InvalidArgument` whose message starts with
//! `invalid ARGUMENT`), change nothing on the host or in the state, and leave the daemon
//! serving. The error kinds themselves, one case each, are in tests/dbus.rs; the CLI's
//! arguments in cpupoolctl/tests/e2e.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;

use common::{Daemon, PrivateBus, Varlink};
use serde_json::{json, Value};
use zbus::zvariant::{OwnedValue, Str};

/// Everything a refused call must leave alone: the state file, the pools, the assignments,
/// every file under the cgroup root, and the runtime drop-in.
fn observed(d: &Daemon, v: &mut Varlink) -> (Vec<u8>, Value, Value, Vec<(String, String)>, bool) {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, fs::read_to_string(&p).unwrap_or_default()));
            }
        }
    }
    let mut files = Vec::new();
    walk(&d.sb.join("cgroup"), &d.sb.join("cgroup"), &mut files);
    files.sort();
    (
        d.state_file(),
        v.call("ListPools", json!({})).unwrap(),
        v.call("ListAssignments", json!({})).unwrap(),
        files,
        d.sb.join("etc/cpupoold/config.d/90-cpupoold-runtime.toml").exists(),
    )
}

fn long(n: usize) -> String {
    "a".repeat(n)
}

#[test]
fn bad_varlink_arguments_are_refused_by_name_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none", "--log-level", "warn"]);
    fs::create_dir_all(d.sb.join("cgroup/k/a")).unwrap();
    // A sibling of the cgroup root, which a traversal would reach.
    fs::create_dir_all(dir.path().join("etc")).unwrap();
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({ "pool": "dp", "target": "cgroup:k/a", "cpus": 2, "id": "held" })).unwrap();
    let before = observed(&d, &mut v);

    let assign = |target: &str| json!({ "pool": "web", "target": target, "millicpus": 100 });
    let too_long_path = format!("cgroup:{}", vec![long(200); 30].join("/"));
    // (method, parameters, error, the argument it must name)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("Assign", assign("cgroup:../../etc"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k/../../../etc"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k/a/.."), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:/etc"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:/sys/fs/cgroup/k/a"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k/./a"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k//a"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k\u{0}/a"), "InvalidArgument", "target"),
        ("Assign", assign("cgroup:k/a\n"), "InvalidArgument", "target"),
        ("Assign", assign(&format!("cgroup:k/{}", long(256))), "InvalidArgument", "target"),
        ("Assign", assign(&too_long_path), "InvalidArgument", "target"),
        ("Assign", assign("unit:.."), "InvalidArgument", "target"),
        ("Assign", assign("unit:../../etc/passwd"), "InvalidArgument", "target"),
        ("Assign", assign("unit:x.frobnicator"), "InvalidArgument", "target"),
        ("Assign", assign(&format!("unit:{}.service", long(300))), "InvalidArgument", "target"),
        ("Assign", assign("pid:-1"), "InvalidArgument", "target"),
        ("Assign", assign("pid:0"), "InvalidArgument", "target"),
        ("Assign", assign("pid:18446744073709551617"), "InvalidArgument", "target"),
        ("Assign", assign("file:/etc/passwd"), "InvalidArgument", "target"),
        ("Assign", json!({ "pool": "dp", "target": "cgroup:k/b", "cpus": -1 }), "InvalidArgument", "cpus"),
        ("Assign", json!({ "pool": "dp", "target": "cgroup:k/b", "cpus": 0 }), "InvalidArgument", "cpus"),
        (
            "Assign",
            json!({ "pool": "dp", "target": "cgroup:k/b", "cpus": 4294967296u64 }),
            "InvalidArgument",
            "cpus",
        ),
        (
            "Assign",
            json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": -5 }),
            "InvalidArgument",
            "millicpus",
        ),
        (
            "Assign",
            json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 0 }),
            "InvalidArgument",
            "millicpus",
        ),
        (
            "Assign",
            json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": i64::MAX }),
            "InsufficientCapacity",
            "",
        ),
        (
            "Assign",
            json!({ "pool": "dp", "target": "cgroup:k/b", "cpus": 4294967295u64 }),
            "InsufficientCapacity",
            "",
        ),
        ("Assign", json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 1e30 }), "", "millicpus"),
        ("Assign", json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": "100" }), "", "millicpus"),
        ("Assign", json!({ "pool": "nope", "target": "cgroup:k/b", "cpus": 1 }), "NoSuchPool", ""),
        ("Assign", json!({ "pool": long(4096), "target": "cgroup:k/b", "cpus": 1 }), "NoSuchPool", ""),
        ("Assign", json!({ "pool": "../web", "target": "cgroup:k/b", "cpus": 1 }), "NoSuchPool", ""),
        (
            "Assign",
            json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 1, "id": long(129) }),
            "InvalidArgument",
            "id",
        ),
        (
            "Assign",
            json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 1, "id": "../x" }),
            "InvalidArgument",
            "id",
        ),
        // Long, yet within the daemon's 64 KiB limit on a call (beyond it, MessageTooLarge).
        ("Release", json!({ "id": long(60_000) }), "NoSuchAssignment", ""),
        ("Release", json!({ "id": "held\u{0}" }), "NoSuchAssignment", ""),
        ("GetPool", json!({ "name": long(60_000) }), "NoSuchPool", ""),
        ("CreatePool", json!({ "name": long(33), "kind": "shared", "cpus": "3" }), "InvalidArgument", "name"),
        (
            "CreatePool",
            json!({ "name": long(60_000), "kind": "shared", "cpus": "3" }),
            "InvalidArgument",
            "name",
        ),
        ("CreatePool", json!({ "name": "../x", "kind": "shared", "cpus": "3" }), "InvalidArgument", "name"),
        ("CreatePool", json!({ "name": "x", "kind": "shared", "count": 0 }), "InvalidArgument", "count"),
        ("CreatePool", json!({ "name": "x", "kind": "shared", "count": -2 }), "InvalidArgument", "count"),
        (
            "CreatePool",
            json!({ "name": "x", "kind": "shared", "count": 1u64 << 40 }),
            "InvalidArgument",
            "count",
        ),
        (
            "CreatePool",
            json!({ "name": "x", "kind": "shared", "count": 1, "numa": -1 }),
            "InvalidArgument",
            "numa",
        ),
        // `dra` as the configuration's: not on a pool kept from the kubelet. (A reserved pool is
        // refused before: there is one already.)
        (
            "CreatePool",
            json!({ "name": "x", "kind": "shared", "count": 1, "kubelet": false, "dra": true }),
            "InvalidArgument",
            "dra",
        ),
        ("CreatePool", json!({ "name": "x", "kind": "shared", "count": 1, "dra": "yes" }), "", "dra"),
        ("ResizePool", json!({ "name": "web", "cpus": "3-" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "a-b" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "7-3" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "3,,7" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "-1" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "0x3" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "99999999999999999999" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "8192" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "0-8191" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": " " }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "3\u{0}7" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "web", "cpus": "100" }), "InvalidArgument", "cpus"),
        ("ResizePool", json!({ "name": "nope", "cpus": "3" }), "NoSuchPool", ""),
        ("DeletePool", json!({ "name": "sys" }), "InvalidArgument", "name"),
    ];
    for (method, params, kind, argument) in &cases {
        let (name, p) =
            v.call(method, params.clone()).err().unwrap_or_else(|| panic!("{method} {params} succeeded"));
        let what = format!("{method} {}", params.to_string().chars().take(200).collect::<String>());
        // Long input is repeated cut short: its first 64 characters and its length.
        let said = p.to_string();
        assert!(said.len() <= 512, "{what}: a {} byte answer: {}...", said.len(), &said[..200]);
        if kind.is_empty() {
            // A value of the wrong JSON type is the protocol's InvalidParameter.
            assert_eq!(name, "org.varlink.service.InvalidParameter", "{what}");
            assert_eq!(p["parameter"], *argument, "{what}");
        } else {
            assert_eq!(name, format!("org.cpupool.Manager.{kind}"), "{what}: {p}");
            if !argument.is_empty() {
                assert_eq!(p["argument"], *argument, "{what}: {p}");
            }
        }
        assert_eq!(observed(&d, &mut v), before, "{what} changed something");
    }
    assert!(!dir.path().join("etc/cpuset.cpus").exists(), "a traversal wrote outside the cgroup root");

    // Not JSON, not UTF-8, no NUL: the connection is dropped; nothing changes; others are served.
    for bytes in [
        &b"\xff\xfe{\"method\":\"org.cpupool.Manager.Assign\"}\0"[..],
        b"{\"method\":\"org.cpupool.Manager.Assign\",\"parameters\":{\"pool\":\"web\",\"target\":\"cgroup:k/\xc3\x28\",\"millicpus\":1}}\0",
        b"{\"method\":\"org.cpupool.Manager.Assign\",\"parameters\":{\"pool\":\"web\",\"target\":\"cgroup:k/b\",\"millicpus\":1}",
        b"{\"method\":",
        b"\0",
        b"[1,2,3]\0",
    ] {
        let mut raw = Varlink::connect(&d.varlink);
        raw.send_raw(bytes).unwrap();
        // Half-close so the daemon sees the end of a message it will never get whole.
        let mut rest = Vec::new();
        let stream = raw.into_stream();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        (&stream).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{:?} got an answer: {}", String::from_utf8_lossy(bytes), String::from_utf8_lossy(&rest));
        assert_eq!(observed(&d, &mut v), before, "{:?} changed something", String::from_utf8_lossy(bytes));
    }
    // More than the message limit without a NUL: answered MessageTooLarge, then dropped.
    let mut raw = Varlink::connect(&d.varlink);
    let big = vec![b'x'; 2 << 20];
    let _ = raw.send_raw(&big);
    let too_large = raw.read().unwrap_or_else(|e| panic!("no answer to an oversized message: {e}"));
    assert_eq!(too_large["error"], "org.cpupool.Manager.MessageTooLarge", "{too_large}");
    assert!(raw.read().is_err(), "the connection stayed open after an oversized message");
    assert_eq!(observed(&d, &mut v), before);
    d.stop();
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn bad_dbus_arguments_are_refused_by_name_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start(dir.path(), &["--bus", &bus.address, "--log-level", "warn"]);
    fs::create_dir_all(d.sb.join("cgroup/k/a")).unwrap();
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({ "pool": "dp", "target": "cgroup:k/a", "cpus": 2, "id": "held" })).unwrap();
    let before = observed(&d, &mut v);
    let rt = rt();
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str()).unwrap().build().await.unwrap()
    });
    let call = |method: &str, body: &dyn Fn(&str) -> zbus::Result<zbus::Message>| -> (String, String) {
        match body(method) {
            Ok(_) => panic!("{method} succeeded"),
            Err(zbus::Error::MethodError(name, msg, _)) => (name.to_string(), msg.unwrap_or_default()),
            Err(e) => panic!("{method}: {e}"),
        }
    };
    let send = |method: &str, body: &dyn erased::Body| -> zbus::Result<zbus::Message> {
        body.send(&rt, &conn, method)
    };
    let opts = |k: &str, v: OwnedValue| std::collections::BTreeMap::from([(k.to_owned(), v)]);
    let s = |x: &str| OwnedValue::from(Str::from(x.to_owned()));
    let long_path = format!("cgroup:{}", vec![long(200); 30].join("/"));
    let cases: Vec<(&str, Box<dyn erased::Body>, &str, &str)> = vec![
        ("Assign", Box::new(("web", "cgroup:../../etc", 0u32, 100u64, "")), "InvalidArgument", "target"),
        ("Assign", Box::new(("web", "cgroup:/etc", 0u32, 100u64, "")), "InvalidArgument", "target"),
        ("Assign", Box::new(("web", "cgroup:k/a/../..", 0u32, 100u64, "")), "InvalidArgument", "target"),
        ("Assign", Box::new(("web", long_path.clone(), 0u32, 100u64, "")), "InvalidArgument", "target"),
        ("Assign", Box::new(("web", "unit:..", 0u32, 100u64, "")), "InvalidArgument", "target"),
        ("Assign", Box::new(("web", "cgroup:k/b", 0u32, 0u64, "")), "InvalidArgument", "cpus"),
        ("Assign", Box::new(("dp", "cgroup:k/b", u32::MAX, 0u64, "")), "InsufficientCapacity", ""),
        // Refused naming the value sent, not taken as 2^63-1.
        ("Assign", Box::new(("web", "cgroup:k/b", 0u32, u64::MAX, "")), "InvalidArgument", "millicpus"),
        ("Assign", Box::new(("web", "cgroup:k/b", 1u32, 1u64, "")), "InvalidArgument", "cpus"),
        ("Assign", Box::new(("nope", "cgroup:k/b", 1u32, 0u64, "")), "NoSuchPool", ""),
        ("Assign", Box::new((long(5000), "cgroup:k/b", 1u32, 0u64, "")), "NoSuchPool", ""),
        ("Assign", Box::new(("web", "cgroup:k/b", 0u32, 1u64, long(129))), "InvalidArgument", "id"),
        ("Release", Box::new((long(100_000),)), "NoSuchAssignment", ""),
        ("GetPool", Box::new((long(100_000),)), "NoSuchPool", ""),
        ("CreatePool", Box::new((long(100_000), "shared", opts("cpus", s("3")))), "InvalidArgument", "name"),
        ("CreatePool", Box::new((long(33), "shared", opts("cpus", s("3")))), "InvalidArgument", "name"),
        (
            "CreatePool",
            Box::new(("x", "shared", opts("count", OwnedValue::from(0u32)))),
            "InvalidArgument",
            "count",
        ),
        (
            "CreatePool",
            Box::new(("x", "shared", opts("count", OwnedValue::from(-3i64)))),
            "InvalidArgument",
            "count",
        ),
        ("ResizePool", Box::new(("web", opts("cpus", s("3-")))), "InvalidArgument", "cpus"),
        ("ResizePool", Box::new(("web", opts("cpus", s("99999999999")))), "InvalidArgument", "cpus"),
        ("ResizePool", Box::new(("web", opts("cpus", OwnedValue::from(3u32)))), "InvalidArgument", "cpus"),
    ];
    for (method, body, kind, argument) in &cases {
        let (name, msg) = call(method, &|m| send(m, body.as_ref()));
        // Long input is repeated cut short: its first 64 characters and its length.
        assert!(msg.len() <= 512, "D-Bus {method}: a {} byte message: {}...", msg.len(), &msg[..200]);
        assert_eq!(name, format!("org.cpupool.Manager1.Error.{kind}"), "D-Bus {method}: {msg}");
        if !argument.is_empty() {
            let named = msg.strip_prefix("invalid ").and_then(|m| m.split(':').next()).unwrap_or_default();
            assert!(named == *argument || named.ends_with(&format!(".{argument}")), "D-Bus {method}: {msg}");
        }
        assert_eq!(observed(&d, &mut v), before, "D-Bus {method} changed something");
    }
    let (_, msg) = call("GetPool", &|m| send(m, &(long(100_000),)));
    assert!(msg.contains(&format!("{}… (100000 bytes)", long(64))), "{msg}");
    let (_, msg) = call("Assign", &|m| send(m, &("web", "cgroup:k/b", 0u32, u64::MAX, "")));
    assert!(msg.contains("18446744073709551615") && msg.contains("9223372036854775807"), "{msg}");
    // A wrong signature is refused by zbus before our code runs (it names it
    // org.freedesktop.zbus.Error rather than the standard DBus.Error.InvalidArgs).
    let (name, msg) = call("Assign", &|m| send(m, &("web", 5u8)));
    assert!(
        ["org.freedesktop.zbus.Error", "org.freedesktop.DBus.Error.InvalidArgs"].contains(&name.as_str()),
        "{name}: {msg}"
    );
    assert_eq!(observed(&d, &mut v), before);
    // D-Bus strings are UTF-8 without NUL by the protocol: dbus-daemon drops a client that
    // sends one, so neither reaches the daemon (varlink, above, carries both).
    drop(conn);
    d.stop();
}

/// Boxed bodies of different types, sent the same way.
mod erased {
    pub trait Body {
        fn send(
            &self,
            rt: &tokio::runtime::Runtime,
            conn: &zbus::Connection,
            method: &str,
        ) -> zbus::Result<zbus::Message>;
    }

    impl<T> Body for T
    where
        T: serde::Serialize + zbus::zvariant::DynamicType,
    {
        fn send(
            &self,
            rt: &tokio::runtime::Runtime,
            conn: &zbus::Connection,
            method: &str,
        ) -> zbus::Result<zbus::Message> {
            rt.block_on(conn.call_method(
                Some("org.cpupool.Manager1"),
                "/org/cpupool/Manager1",
                Some("org.cpupool.Manager1"),
                method,
                self,
            ))
        }
    }
}
