#![allow(clippy::unwrap_used)]
//! The CDI rules, from the CDI project (SPEC.md, `specs-go/version.go`, `pkg/parser`), as
//! examples its own rules decide, and claims with uids as an API server makes them.

use proptest::prelude::*;
use serde_json::json;
use test_support::apiserver;

use super::*;

fn ok(r: Result<(), String>) -> bool {
    r.is_ok()
}

#[test]
fn names_by_the_cdi_parser_rules() {
    // Device names: a letter or digit first and last; _ - . : between.
    for good in ["0", "dev", "01a1c1a1-0000-4000-8000-0000000000d1", "dev_1:2.3", "A9"] {
        assert!(ok(check_device_name(good)), "{good}");
    }
    for bad in ["", "-dev", "dev-", "_gpu", "gpu_", "a b", "a/b", "a=b", "dev:"] {
        assert!(!ok(check_device_name(bad)), "{bad}");
    }
    // Vendors and classes: a letter first; _ - . between; no `:`.
    for good in ["vendor.com", "a", "dra.cpupool.io", "other-vendor1.com", "class.subclass", "c-lass_2"] {
        assert!(ok(check_vendor_or_class(good)), "{good}");
    }
    for bad in ["", "_invalid.com", "invalid2.com-", "_class", "class_", "0vendor", "a:b", "a/b"] {
        assert!(!ok(check_vendor_or_class(bad)), "{bad}");
    }
}

fn one(version: &str, kind: &str, name: &str) -> Value {
    json!({"cdiVersion": version, "kind": kind, "devices": [{"name": name, "containerEdits": {"env": ["A=1"]}}]})
}

#[test]
fn the_version_is_the_lowest_the_contents_allow() {
    // SPEC.md's table: digit-first device names from 0.5.0, a dotted class from 0.6.0.
    assert_eq!(min_version("cpu", ["c1a1c1a1-0000-4000-8000-0000000000d1"]), "0.3.0");
    assert_eq!(min_version("cpu", ["01a1c1a1-0000-4000-8000-0000000000d1"]), "0.5.0");
    assert_eq!(min_version("cpu", ["a", "9"]), "0.5.0");
    assert_eq!(min_version("cpu.x", ["a"]), "0.6.0");
    // What issue 33 measured: containerd refused the 0.3.0 spec of a digit-first claim.
    let digit = "01a1c1a1-0000-4000-8000-0000000000d1";
    let e = validate(&one("0.3.0", "dra.cpupool.io/cpu", digit)).unwrap_err();
    assert_eq!(e.field, "cdiVersion");
    assert!(e.reason.contains("at least 0.5.0"), "{e}");
    assert!(validate(&one("0.4.0", "dra.cpupool.io/cpu", digit)).is_err());
    for v in ["0.5.0", "v0.5.0", "0.6.0", "1.0.0", "1.1.0"] {
        assert_eq!(validate(&one(v, "dra.cpupool.io/cpu", digit)), Ok(()), "{v}");
    }
    assert_eq!(validate(&one("0.3.0", "dra.cpupool.io/cpu", "c1a1")), Ok(()));
    assert!(validate(&one("0.5.0", "dra.cpupool.io/cpu.x", "c1a1")).is_err());
    assert_eq!(validate(&one("0.6.0", "dra.cpupool.io/cpu.x", "c1a1")), Ok(()));
    // Versions never released are refused, as the library refuses them.
    for v in ["0.9.0", "2.0.0", "0.5", ""] {
        assert_eq!(validate(&one(v, "dra.cpupool.io/cpu", "c1a1")).unwrap_err().field, "cdiVersion", "{v}");
    }
}

#[test]
fn a_spec_breaking_the_rules_is_refused_naming_the_field_and_never_written() {
    let field = |v: Value| validate(&v).unwrap_err().field;
    assert_eq!(field(one("0.5.0", "dra.cpupool.io", "a")), "kind");
    assert_eq!(field(one("0.5.0", "_dra/cpu", "a")), "kind");
    assert_eq!(field(one("0.5.0", "dra.cpupool.io/cpu", "a-")), "devices[0].name");
    assert_eq!(field(json!({"cdiVersion": "0.3.0", "kind": "a/b", "devices": []})), "devices");
    assert_eq!(
        field(
            json!({"cdiVersion": "0.3.0", "kind": "a/b", "devices": [{"name": "x", "containerEdits": {"env": ["=1"]}}]})
        ),
        "devices[0].containerEdits.env[0]"
    );
    assert_eq!(
        field(
            json!({"cdiVersion": "0.3.0", "kind": "a/b", "devices": [{"name": "x", "containerEdits": {"mounts": []}}]})
        ),
        "devices[0].containerEdits.mounts"
    );
    let twice = json!({"cdiVersion": "0.3.0", "kind": "a/b", "devices": [
        {"name": "x", "containerEdits": {"env": ["A=1"]}}, {"name": "x", "containerEdits": {"env": ["A=1"]}}]});
    assert_eq!(field(twice), "devices[1].name");
    // A uid that is no CDI device name: refused before anything is written.
    assert_eq!(
        spec("dra.cpupool.io", "u-", &[("A".into(), "1".into())]).unwrap_err().field,
        "devices[0].name"
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cdi = CdiDir::new(&dir.path().join("cdi"));
    assert!(matches!(cdi.write("x", &one("0.3.0", "dra.cpupool.io/cpu", "01")), Err(CdiError::Invalid(_))));
    assert!(!cdi.has("x") && !cdi.path().exists());
}

#[test]
fn a_spec_names_the_kind_the_device_and_its_env() {
    let uid = "c1a1c1a1-0000-4000-8000-0000000000d1";
    let s = spec("dra.cpupool.io", uid, &[("CPUPOOL_CPUS".into(), "1-2".into())])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s["cdiVersion"], "0.3.0");
    assert_eq!(s["kind"], "dra.cpupool.io/cpu");
    assert_eq!(s["devices"][0]["name"], uid);
    assert_eq!(s["devices"][0]["containerEdits"]["env"][0], "CPUPOOL_CPUS=1-2");
    assert_eq!(device_id("dra.cpupool.io", uid), format!("dra.cpupool.io/cpu={uid}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cdi = CdiDir::new(&dir.path().join("cdi"));
    cdi.write(uid, &s).unwrap_or_else(|e| panic!("{e}"));
    assert!(cdi.has(uid));
    cdi.remove(uid).unwrap_or_else(|e| panic!("{e}"));
    cdi.remove(uid).unwrap_or_else(|e| panic!("{e}"));
    assert!(!cdi.has(uid));
}

/// A CDI directory that is a symbolic link is not written through: the specs would land
/// wherever it points. A link above it (as `/var/run` is) is followed.
#[test]
fn a_cdi_directory_that_is_a_link_is_refused() {
    let uid = "0a1a1a1a-0000-4000-8000-0000000000d1";
    let s =
        spec("dra.cpupool.io", uid, &[("CPUPOOL_CPUS".into(), "1".into())]).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("cdi")).unwrap_or_else(|e| panic!("{e}"));
    let e = CdiDir::new(&dir.path().join("cdi")).write(uid, &s).err().unwrap_or_else(|| panic!("written"));
    assert!(e.to_string().contains("cdi"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).map(Iterator::count).unwrap_or(1), 0);
    // Through a link to its parent, as /var/run -> /run.
    std::fs::create_dir(dir.path().join("run")).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(dir.path().join("run"), dir.path().join("varrun"))
        .unwrap_or_else(|e| panic!("{e}"));
    CdiDir::new(&dir.path().join("varrun/cdi")).write(uid, &s).unwrap_or_else(|e| panic!("{e}"));
    assert!(dir.path().join("run/cdi").join(file_name(uid)).is_file());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every claim's spec passes the CDI rules, declares the lowest version they allow (0.5.0
    /// exactly when the uid begins with a digit), and its device id parses back to the uid.
    #[test]
    fn every_api_server_uid_gives_a_spec_the_cdi_rules_take(uid in apiserver::uids(), prefix in "[a-z][a-z0-9]{0,8}(\\.[a-z][a-z0-9]{0,8}){0,3}") {
        prop_assert!(apiserver::is_v4(&uid));
        let driver = format!("dra.{prefix}");
        let s = spec(&driver, &uid, &[("CPUPOOL_CLAIM".into(), uid.clone())]);
        let s = s.map_err(|e| TestCaseError::fail(e.to_string()))?;
        let digit = uid.starts_with(|c: char| c.is_ascii_digit());
        prop_assert_eq!(&s["cdiVersion"], if digit { "0.5.0" } else { "0.3.0" });
        prop_assert_eq!(validate(&s), Ok(()));
        let lower = json!({"cdiVersion": "0.4.0", "kind": s["kind"].clone(), "devices": s["devices"].clone()});
        prop_assert_eq!(validate(&lower).is_ok(), !digit);
        let id = device_id(&driver, &uid);
        let kind = format!("{driver}/cpu");
        prop_assert_eq!(id.split_once('='), Some((kind.as_str(), uid.as_str())));
    }
}
