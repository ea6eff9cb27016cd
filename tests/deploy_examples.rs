//! The shipped containerd drop-in that makes a missing cpupoold fail container creation
//! (`deploy/examples/containerd-nri-require-cpupoold.toml`, docs/interfaces.md "NRI plugin"):
//! it names the plugin as the daemon registers it with NRI, and uses only the keys of NRI's
//! default validator (`DefaultValidatorConfig`'s toml tags in containerd/nri
//! plugins/default-validator/default-validator.go) under containerd's NRI plugin id. The guest
//! suite (tests/vm/checks-containers/77-nri-required.sh) loads it into a real containerd 2.x.

use std::path::Path;

const DROPIN: &str = "deploy/examples/containerd-nri-require-cpupoold.toml";

/// The keys of NRI v0.10+'s `DefaultValidatorConfig`, as its toml tags spell them.
const VALIDATOR_KEYS: &[&str] = &[
    "enable",
    "reject_oci_hook_adjustment",
    "reject_runtime_default_seccomp_adjustment",
    "reject_unconfined_seccomp_adjustment",
    "reject_custom_seccomp_adjustment",
    "reject_namespace_adjustment",
    "reject_sysctl_adjustment",
    "required_plugins",
    "tolerate_missing_plugins_annotation",
];

fn dropin() -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DROPIN);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("the drop-in is shipped: {e}"));
    text.parse().unwrap_or_else(|e| panic!("the drop-in is TOML: {e}"))
}

#[test]
fn the_dropin_requires_the_plugin_by_the_name_it_registers() {
    let t = dropin();
    // containerd 2.x's configuration version: an import may not have a higher version than the
    // main file, and plugin ids of version 3 are the ones below.
    assert_eq!(t.get("version").and_then(|v| v.as_integer()), Some(3));
    let nri =
        t["plugins"]["io.containerd.nri.v1.nri"].as_table().unwrap_or_else(|| panic!("NRI's plugin section"));
    let v = nri["default_validator"].as_table().unwrap_or_else(|| panic!("default_validator"));
    for key in v.keys() {
        assert!(VALIDATOR_KEYS.contains(&key.as_str()), "{key} is not a default_validator key");
    }
    assert_eq!(v["enable"].as_bool(), Some(true));
    let required: Vec<&str> = v["required_plugins"]
        .as_array()
        .unwrap_or_else(|| panic!("a list"))
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    // NRI's validator knows a plugin as NAME and as INDEX-NAME (GetPluginMap).
    let names = [
        cpupoold::kubernetes::nri::PLUGIN_NAME.to_string(),
        format!("{}-{}", cpupoold::kubernetes::nri::PLUGIN_INDEX, cpupoold::kubernetes::nri::PLUGIN_NAME),
    ];
    assert!(
        required.iter().any(|r| names.iter().any(|n| n == r)),
        "required_plugins {required:?} names none of {names:?}"
    );
    // The toleration annotation is a Kubernetes annotation key: a DNS prefix, then a name.
    let tolerate = v["tolerate_missing_plugins_annotation"].as_str().unwrap_or_else(|| panic!("a string"));
    assert!(tolerate.len() <= 253 && !tolerate.is_empty());
    assert!(tolerate.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
}
