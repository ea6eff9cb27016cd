//! The files under `deploy/`: each document parses as the Kubernetes type its `kind` names, the
//! CRD is the one generated from [`super::crd`], the DeviceClasses those [`super::classes`] makes
//! of the example DRA pools, and the examples load as configuration.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;

use crate::core::topology::Topology;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(rel)
}

/// Every document of `rel`, as (kind, YAML value).
fn documents(rel: &str) -> Vec<(String, serde_yaml::Value)> {
    let text = std::fs::read_to_string(deploy(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{rel}: {e}"));
            let kind = v
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or_else(|| panic!("{rel}: a document without kind"));
            (kind.to_owned(), v)
        })
        .collect()
}

fn typed<T: DeserializeOwned>(rel: &str, v: &serde_yaml::Value) -> T {
    serde_yaml::from_value(v.clone()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Parses each document as its kind's type; returns how many of each kind.
fn parse_all(rel: &str) -> Vec<String> {
    let docs = documents(rel);
    for (kind, v) in &docs {
        match kind.as_str() {
            "Namespace" => drop(typed::<Namespace>(rel, v)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(rel, v)),
            "ClusterRole" => drop(typed::<ClusterRole>(rel, v)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(rel, v)),
            "Role" => drop(typed::<Role>(rel, v)),
            "RoleBinding" => drop(typed::<RoleBinding>(rel, v)),
            "ConfigMap" => drop(typed::<ConfigMap>(rel, v)),
            "DaemonSet" => drop(typed::<DaemonSet>(rel, v)),
            "Pod" => drop(typed::<Pod>(rel, v)),
            "CustomResourceDefinition" => drop(typed::<CustomResourceDefinition>(rel, v)),
            "DeviceClass" => drop(typed::<DeviceClass>(rel, v)),
            other => panic!("{rel}: unexpected kind {other}"),
        }
    }
    docs.into_iter().map(|(k, _)| k).collect()
}

#[test]
fn the_shipped_crd_is_the_generated_one() {
    let generated = super::crd::crd_yaml().unwrap_or_else(|e| panic!("{e}"));
    let shipped = std::fs::read_to_string(deploy("crd.yaml")).unwrap_or_default();
    assert!(
        shipped == generated,
        "deploy/crd.yaml differs from the CRD generated from src/kubernetes/cluster/crd.rs; \
         run `cargo run --features k8s -- --print-crd > deploy/crd.yaml`"
    );
    let crd: CustomResourceDefinition = serde_yaml::from_str(&shipped).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(crd.spec.group, "cpupool.io");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
    assert!(crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
}

#[test]
fn every_manifest_parses_as_its_kind() {
    assert_eq!(parse_all("crd.yaml"), ["CustomResourceDefinition"]);
    assert_eq!(
        parse_all("rbac.yaml"),
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    );
    assert_eq!(parse_all("daemonset.yaml"), ["ConfigMap", "DaemonSet"]);
    assert_eq!(parse_all("configmap-example.yaml"), ["ConfigMap", "ConfigMap", "ConfigMap"]);
    assert_eq!(parse_all("deviceclasses.yaml"), ["DeviceClass", "DeviceClass"]);
    assert_eq!(parse_all("examples/pod-exclusive.yaml"), ["Pod"]);
    assert_eq!(parse_all("examples/pod-shared.yaml"), ["Pod"]);
}

#[test]
fn the_daemonset_is_privileged_without_host_pid_and_mounts_the_host() {
    let docs = documents("daemonset.yaml");
    let ds: DaemonSet = typed("daemonset.yaml", &docs[1].1);
    let pod = ds.spec.and_then(|s| s.template.spec).unwrap_or_else(|| panic!("a pod spec"));
    assert_ne!(pod.host_pid, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("cpupoold"));
    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().and_then(|s| s.privileged), Some(true));
    let mounts: Vec<&str> = c.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    for needed in
        ["/sys/fs/cgroup", "/var/lib/kubelet", "/var/run/cdi", "/run/dbus", "/run/systemd", "/run/cpupoold"]
    {
        assert!(mounts.contains(&needed), "{needed} not mounted: {mounts:?}");
    }
    let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert!(env.contains(&"NODE_NAME") && env.contains(&"POD_NAMESPACE"), "{env:?}");
    // Owning org.cpupool.Manager1 on the host's bus needs a policy file only the packages
    // install: the DaemonSet serves varlink alone.
    let command: Vec<&str> = c.command.iter().flatten().map(String::as_str).collect();
    assert!(command.windows(2).any(|w| w == ["--bus", "none"]), "{command:?}");
}

#[test]
fn the_rbac_grants_exactly_what_the_daemon_uses() {
    let docs = documents("rbac.yaml");
    let rules = |v: &serde_yaml::Value| -> Vec<(String, Vec<String>)> {
        let role: ClusterRole = typed("rbac.yaml", v);
        role.rules
            .into_iter()
            .flatten()
            .flat_map(|r| r.resources.unwrap_or_default().into_iter().map(move |res| (res, r.verbs.clone())))
            .collect()
    };
    let cluster = rules(&docs[2].1);
    let verbs =
        |res: &str| cluster.iter().find(|(r, _)| r == res).map(|(_, v)| v.clone()).unwrap_or_default();
    assert_eq!(verbs("nodes"), ["list", "watch"]);
    assert_eq!(verbs("pods"), ["list", "watch"]);
    assert_eq!(verbs("cpupoolnodes"), ["create", "patch"]);
    assert_eq!(verbs("cpupoolnodes/status"), ["patch"]);
    // DRA: this node's ResourceSlices (watched, applied, the left-over ones deleted), the
    // claims the kubelet plugin prepares, the classes their requests name.
    assert_eq!(verbs("resourceslices"), ["get", "list", "watch", "create", "update", "patch", "delete"]);
    assert_eq!(verbs("resourceclaims"), ["get", "list", "watch"]);
    assert_eq!(verbs("deviceclasses"), ["get", "list", "watch"]);
    let role: Role = typed("rbac.yaml", &docs[4].1);
    let rule = &role.rules.unwrap_or_default()[0];
    assert_eq!(
        (rule.resources.clone().unwrap_or_default(), rule.verbs.clone()),
        (vec!["configmaps".to_owned()], vec!["list".to_owned(), "watch".to_owned()])
    );
}

/// Each example ConfigMap's settings, loaded over the bootstrap configuration: (name, settings).
fn example_settings() -> Vec<(String, crate::config::Settings)> {
    let ds = documents("daemonset.yaml");
    let bootstrap: ConfigMap = typed("daemonset.yaml", &ds[0].1);
    let bootstrap = bootstrap.data.unwrap_or_default();
    let base =
        bootstrap.get("10-k8s.toml").unwrap_or_else(|| panic!("10-k8s.toml in the bootstrap ConfigMap"));
    documents("configmap-example.yaml")
        .into_iter()
        .map(|(_, v)| {
            let cm: ConfigMap = typed("configmap-example.yaml", &v);
            let name = cm.metadata.name.clone().unwrap_or_default();
            assert!(name.starts_with(super::config::PREFIX), "{name}");
            let text = cm.data.unwrap_or_default().remove(super::config::KEY).unwrap_or_default();
            let settings = crate::config::load_strs(&[("10-k8s.toml", base), (&name, &text)])
                .unwrap_or_else(|e| panic!("{name}: {}", crate::error_chain(&e)));
            (name, settings)
        })
        .collect()
}

#[test]
fn the_example_configmaps_load_over_the_bootstrap_config() {
    let topo = Topology::synthetic(1, 8, 2, 1);
    for (name, settings) in example_settings() {
        assert!(settings.k8s.enabled);
        settings.resolve_pools(&topo).unwrap_or_else(|e| panic!("{name}: {}", crate::error_chain(&e)));
    }
}

#[test]
fn the_shipped_deviceclasses_are_those_of_the_example_dra_pools() {
    let (_, settings) = example_settings()
        .into_iter()
        .find(|(name, _)| name == "cpupoold-config.group.dra")
        .unwrap_or_else(|| panic!("the example ConfigMap cpupoold-config.group.dra"));
    let generated = super::classes::classes_yaml(&settings).unwrap_or_else(|e| panic!("{e}"));
    let shipped = std::fs::read_to_string(deploy("deviceclasses.yaml")).unwrap_or_default();
    assert!(
        shipped == generated,
        "deploy/deviceclasses.yaml differs from the DeviceClasses of cpupoold-config.group.dra's pools \
         (src/kubernetes/cluster/classes.rs); write this to it:\n{generated}"
    );
    let docs = documents("deviceclasses.yaml");
    let classes: Vec<DeviceClass> = docs.iter().map(|(_, v)| typed("deviceclasses.yaml", v)).collect();
    let summary: Vec<(Option<&str>, Option<&str>, Option<&str>)> = classes
        .iter()
        .map(|c| {
            let selector = c.spec.selectors.as_deref().and_then(|s| s.first()).and_then(|s| s.cel.as_ref());
            (
                c.metadata.name.as_deref(),
                c.spec.extended_resource_name.as_deref(),
                selector.map(|s| s.expression.as_str()),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                Some("dp.dra.cpupool.io"),
                Some("cpupool.io/dp"),
                Some(
                    r#"device.driver == "dra.cpupool.io" && device.attributes["dra.cpupool.io"].pool == "dp""#
                )
            ),
            (
                Some("shared.dra.cpupool.io"),
                Some("cpupool.io/shared"),
                Some(
                    r#"device.driver == "dra.cpupool.io" && device.attributes["dra.cpupool.io"].pool == "shared""#
                )
            ),
        ]
    );
}
