//! A daemon built without the `k8s` feature refuses a configuration that enables `[k8s]`,
//! saying why, instead of silently running without the cluster integration; and its flags
//! (`--print-crd`, `--print-deviceclasses`) say which build has them. (`.ci/run` runs
//! this without the feature: `cargo test --test k8s_not_built`.)
#![cfg(not(feature = "k8s"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

#[test]
fn k8s_enabled_without_the_feature_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sb = dir.path().join("sb");
    std::fs::create_dir_all(sb.join("etc/cpupoold")).unwrap();
    std::fs::write(
        sb.join("etc/cpupoold/config.toml"),
        format!("{}\n[k8s]\nenabled = true\n", common::CONFIG),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(&sb)
        .args(["--topology", "1x4x2:1", "--bus", "none"])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started anyway:\n{stderr}");
    assert!(
        stderr.contains("k8s.enabled = true, but this cpupoold was built without the `k8s` feature"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("READY"));
}

#[test]
fn the_cluster_flags_say_which_build_has_them() {
    for flag in ["--print-crd", "--print-deviceclasses"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
            .arg(flag)
            .env_remove("NOTIFY_SOCKET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(out.stdout.is_empty(), "{flag}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(!stderr.contains("unexpected argument"), "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("cpupoold: {flag} is part of the Kubernetes cluster integration"))
                && stderr.contains("built without the `k8s` feature")
                && stderr.contains("cargo build --features k8s"),
            "{flag}: {stderr}"
        );
    }
}
