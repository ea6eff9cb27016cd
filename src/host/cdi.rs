//! CDI specs (the Container Device Interface, cncf-tags/container-device-interface SPEC.md):
//! one JSON file per prepared DRA claim in the CDI directory (`paths.cdi_dir`, `/var/run/cdi`),
//! which the container runtime reads when a container names the claim's CDI device.
//!
//! ```text
//! k8s::dra prepare ──write──► <cdi_dir>/cpupoold-<uid>.json ──runtime──► the container's env
//!   (kind dra.cpupool.io/cpu, device <uid>,                   (CPUPOOL_CLAIM=<uid> → the NRI
//!    containerEdits.env)                                       plugin gives it the CPUs)
//! ```
//!
//! The spec carries environment only: the cpuset is the NRI plugin's to set at CreateContainer
//! (CDI has no edit for it). `cdiVersion` is the lowest that has what is used (env edits,
//! 0.3.0), so every runtime's CDI library takes it.

use std::path::Path;

use crate::host::fsutil::{FsError, Root};

/// The CDI version written.
pub const VERSION: &str = "0.3.0";
/// The device class of the kind `<driver>/cpu`.
pub const CLASS: &str = "cpu";

/// The fully qualified CDI device of claim `uid`: `dra.cpupool.io/cpu=<uid>`.
pub fn device_id(driver: &str, uid: &str) -> String {
    format!("{driver}/{CLASS}={uid}")
}

/// The spec's file name for claim `uid`.
pub fn file_name(uid: &str) -> String {
    format!("cpupoold-{uid}.json")
}

/// The spec of one claim: one device named `uid` whose edits set `env`.
pub fn spec(driver: &str, uid: &str, env: &[(String, String)]) -> serde_json::Value {
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    serde_json::json!({
        "cdiVersion": VERSION,
        "kind": format!("{driver}/{CLASS}"),
        "devices": [{"name": uid, "containerEdits": {"env": env}}],
    })
}

/// The CDI directory.
#[derive(Debug, Clone)]
pub struct CdiDir {
    root: Root,
}

impl CdiDir {
    /// The directory at `path` (made when the first spec is written).
    pub fn new(path: &Path) -> CdiDir {
        CdiDir { root: Root::new(path) }
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// Writes claim `uid`'s spec durably (a runtime never reads half of it).
    pub fn write(&self, uid: &str, spec: &serde_json::Value) -> Result<(), FsError> {
        let root = Root::create(self.root.path(), 0o755)?;
        let data = serde_json::to_vec_pretty(spec).unwrap_or_default();
        root.replace(file_name(uid), &data, 0o644)
    }

    /// Whether claim `uid`'s spec is there.
    pub fn has(&self, uid: &str) -> bool {
        self.root.path().join(file_name(uid)).is_file()
    }

    /// Removes claim `uid`'s spec; none is no error.
    pub fn remove(&self, uid: &str) -> Result<(), FsError> {
        match self.root.remove_file(file_name(uid)) {
            Ok(()) => self.root.sync_dir(""),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_the_kind_the_device_and_its_env() {
        let s = spec("dra.cpupool.io", "u1", &[("CPUPOOL_CPUS".into(), "1-2".into())]);
        assert_eq!(s["cdiVersion"], "0.3.0");
        assert_eq!(s["kind"], "dra.cpupool.io/cpu");
        assert_eq!(s["devices"][0]["name"], "u1");
        assert_eq!(s["devices"][0]["containerEdits"]["env"][0], "CPUPOOL_CPUS=1-2");
        assert_eq!(device_id("dra.cpupool.io", "u1"), "dra.cpupool.io/cpu=u1");
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cdi = CdiDir::new(&dir.path().join("cdi"));
        cdi.write("u1", &s).unwrap_or_else(|e| panic!("{e}"));
        assert!(cdi.has("u1"));
        cdi.remove("u1").unwrap_or_else(|e| panic!("{e}"));
        cdi.remove("u1").unwrap_or_else(|e| panic!("{e}"));
        assert!(!cdi.has("u1"));
    }
}
