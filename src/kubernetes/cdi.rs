//! CDI specs (the Container Device Interface, cncf-tags/container-device-interface SPEC.md):
//! one JSON file per prepared DRA claim in the CDI directory (`paths.cdi_dir`, `/var/run/cdi`),
//! which the container runtime reads when a container names the claim's CDI device.
//!
//! ```text
//! engine PrepareClaim ─write─► <cdi_dir>/cpupoold-<uid>.json ──runtime──► the container's env
//!   (kind dra.cpupool.io/cpu, device <uid>,                   (CPUPOOL_CLAIM=<uid> → the NRI
//!    containerEdits.env)                                       plugin gives it the CPUs)
//! ```
//!
//! The spec carries environment only: the cpuset is the NRI plugin's to set at CreateContainer
//! (CDI has no edit for it).
//!
//! # The version written, and the rules checked
//! A runtime's CDI library (containerd 1.7 and 2.x vendor it) refuses a spec whose `cdiVersion`
//! is below what the spec's contents need, or one it does not know; so `cdiVersion` is the
//! lowest the contents allow, which every library since that version takes. By the spec's
//! table of released versions (SPEC.md) and its `specs-go/version.go`, of what a spec of ours
//! can hold: environment edits and letter-first names are 0.3.0, the earliest the library
//! takes; a device name beginning with a digit needs 0.5.0 (a claim's uid is a random UUID:
//! 10 in 16 begin with a digit); a dot in the kind's class segment needs 0.6.0.
//!
//! Names are checked by the rules of its `pkg/parser`: the vendor (`dra.<prefix>`) and the
//! class begin with a letter, the device name with a letter or digit; all three end with one,
//! and have only letters, digits, `_ - .` (and `:` in a device name) between. [`validate`]
//! checks a written spec as a runtime would, and [`CdiDir::write`] reads each back through it.

use std::path::Path;

use serde_json::Value;

use crate::host::fsutil::{FsError, Root};

/// The versions a spec of ours may declare, oldest first: the earliest the library takes (and
/// what environment edits need), what a digit-first device name needs, what a dotted class
/// needs. The released versions the library knows are [`RELEASED`].
pub const V0_3_0: &str = "0.3.0";
/// A device name beginning with a digit (SPEC.md: "Beginning with digits is supported from
/// v0.5.0").
pub const V0_5_0: &str = "0.5.0";
/// A dot in the kind's class segment (SPEC.md: "Dots (.) are supported from v0.6.0").
pub const V0_6_0: &str = "0.6.0";
/// The CDI versions released (SPEC.md's table), oldest first; a library knows those up to its
/// own and refuses any other.
pub const RELEASED: [&str; 10] =
    ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"];
/// The device class of the kind `<driver>/cpu`.
pub const CLASS: &str = "cpu";
/// The largest spec read back.
const CAP: u64 = 64 * 1024;

/// A spec, or a name in it, that the CDI rules refuse: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CDI spec field `{field}`: {reason}")]
pub struct Invalid {
    /// The field (`kind`, `devices[0].name`, `cdiVersion`).
    pub field: String,
    /// Why, naming the value (cut short).
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: String) -> Invalid {
    Invalid { field: field.into(), reason }
}

/// Why a spec could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The spec breaks the CDI rules: nothing was written.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The file system refused.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// What was read back is not what was written.
    #[error("`{file}` reads back other than written: {reason}")]
    ReadBack {
        /// The file.
        file: String,
        /// How it differs.
        reason: String,
    },
}

/// Refuses a CDI directory that is itself a symbolic link: the daemon, as root, would write
/// the specs wherever it points (a link made in place of `/run/cdi`). The directories above it
/// are the system's (`/var/run` is a link to `/run` on Debian) and are followed.
fn refuse_a_link(dir: &std::path::Path) -> Result<(), FsError> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => Err(FsError {
            op: "writing a CDI spec into",
            path: dir.to_owned(),
            source: std::io::Error::other(crate::host::fsutil::SymlinkRefused { link: dir.to_owned() }),
        }),
        _ => Ok(()),
    }
}

/// Whether `c` is a letter or digit, the only bytes a CDI name may begin or end with.
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// The CDI rule shared by every name: `first` may begin it, it ends with a letter or digit, and
/// between are letters, digits and `middle`.
fn check_name(name: &str, first: fn(u8) -> bool, first_is: &str, middle: &[u8]) -> Result<(), String> {
    let b = name.as_bytes();
    let (Some(&head), Some(&tail)) = (b.first(), b.last()) else { return Err("it is empty".into()) };
    let shown = crate::core::echo(name);
    if !first(head) {
        return Err(format!("`{shown}` must begin with {first_is}"));
    }
    if !alnum(tail) {
        return Err(format!("`{shown}` must end with a letter or digit"));
    }
    match b[1..b.len().saturating_sub(1).max(1)].iter().find(|c| !alnum(**c) && !middle.contains(c)) {
        Some(c) => Err(format!(
            "`{shown}` has `{}`, not a letter, digit or one of `{}`",
            char::from(*c),
            String::from_utf8_lossy(middle)
        )),
        None => Ok(()),
    }
}

/// A CDI device name: a letter or digit first and last, letters, digits, `_ - . :` between.
pub fn check_device_name(name: &str) -> Result<(), String> {
    check_name(name, alnum, "a letter or digit", b"_-.:")
}

/// A CDI vendor or class name: a letter first, a letter or digit last, letters, digits,
/// `_ - .` between.
pub fn check_vendor_or_class(name: &str) -> Result<(), String> {
    check_name(name, |c| c.is_ascii_alphabetic(), "a letter", b"_-.")
}

/// The lowest `cdiVersion` for a spec of class `class` whose devices are `names` and whose
/// edits are environment only.
pub fn min_version<'a>(class: &str, names: impl IntoIterator<Item = &'a str>) -> &'static str {
    if class.contains('.') {
        V0_6_0
    } else if names.into_iter().any(|n| n.as_bytes().first().is_some_and(u8::is_ascii_digit)) {
        V0_5_0
    } else {
        V0_3_0
    }
}

/// Checks `spec` as a runtime's CDI library would load a spec of ours: only the fields a spec
/// of ours has (`cdiVersion`, `kind`, `devices[].name`, `devices[].containerEdits.env`), a
/// released version no lower than the contents need, valid names, unique devices, each with
/// an environment edit of `NAME=value`s.
pub fn validate(spec: &Value) -> Result<(), Invalid> {
    let Some(top) = spec.as_object() else { return Err(invalid("", "not a JSON object".into())) };
    only(top, "", &["cdiVersion", "kind", "devices"])?;
    let version = top.get("cdiVersion").and_then(Value::as_str).unwrap_or_default();
    let Some(declared) = RELEASED.iter().position(|v| *v == version.strip_prefix('v').unwrap_or(version))
    else {
        return Err(invalid(
            "cdiVersion",
            format!("`{}` is no released CDI version", crate::core::echo(version)),
        ));
    };
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or_default();
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(invalid("kind", format!("`{}` is not <vendor>/<class>", crate::core::echo(kind))));
    };
    check_vendor_or_class(vendor).map_err(|r| invalid("kind", format!("vendor: {r}")))?;
    check_vendor_or_class(class).map_err(|r| invalid("kind", format!("class: {r}")))?;
    let devices = top.get("devices").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if devices.is_empty() {
        return Err(invalid("devices", "a spec has at least one device".into()));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let field = format!("devices[{i}]");
        let Some(d) = d.as_object() else { return Err(invalid(field, "not a JSON object".into())) };
        only(d, &field, &["name", "containerEdits"])?;
        let name = d.get("name").and_then(Value::as_str).unwrap_or_default();
        check_device_name(name).map_err(|r| invalid(format!("{field}.name"), r))?;
        if names.contains(&name) {
            return Err(invalid(format!("{field}.name"), format!("`{name}` is named twice")));
        }
        names.push(name);
        let field = format!("{field}.containerEdits");
        let Some(edits) = d.get("containerEdits").and_then(Value::as_object) else {
            return Err(invalid(field, "a device has edits".into()));
        };
        only(edits, &field, &["env"])?;
        let env = edits.get("env").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        if env.is_empty() {
            return Err(invalid(field, "a device has edits".into()));
        }
        for (j, e) in env.iter().enumerate() {
            let named = e.as_str().and_then(|e| e.find('=')).is_some_and(|at| at > 0);
            if !named {
                return Err(invalid(format!("{field}.env[{j}]"), "not NAME=value".into()));
            }
        }
    }
    let needed = min_version(class, names.iter().copied());
    if RELEASED.iter().position(|v| *v == needed).is_some_and(|n| n > declared) {
        return Err(invalid("cdiVersion", format!("{version}: what the spec holds needs at least {needed}")));
    }
    Ok(())
}

/// Refuses a key of `obj` not among `known`.
fn only(obj: &serde_json::Map<String, Value>, at: &str, known: &[&str]) -> Result<(), Invalid> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(invalid(
            if at.is_empty() { k.clone() } else { format!("{at}.{k}") },
            "not a field a spec of cpupoold's has".into(),
        )),
        None => Ok(()),
    }
}

/// The fully qualified CDI device of claim `uid`: `dra.cpupool.io/cpu=<uid>`.
pub fn device_id(driver: &str, uid: &str) -> String {
    format!("{driver}/{CLASS}={uid}")
}

/// The spec's file name for claim `uid`.
pub fn file_name(uid: &str) -> String {
    format!("cpupoold-{uid}.json")
}

/// The spec of one claim: one device named `uid` whose edits set `env`, declaring the lowest
/// version its contents allow; refused, naming the field, where the CDI rules refuse it.
pub fn spec(driver: &str, uid: &str, env: &[(String, String)]) -> Result<Value, Invalid> {
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let spec = serde_json::json!({
        "cdiVersion": min_version(CLASS, [uid]),
        "kind": format!("{driver}/{CLASS}"),
        "devices": [{"name": uid, "containerEdits": {"env": env}}],
    });
    validate(&spec)?;
    Ok(spec)
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

    /// Writes claim `uid`'s spec durably (a runtime never reads half of it), once it passes
    /// [`validate`], and reads it back: what is there must be that spec and pass again.
    pub fn write(&self, uid: &str, spec: &Value) -> Result<(), CdiError> {
        validate(spec)?;
        let root = Root::create(self.root.path(), 0o755)?;
        refuse_a_link(self.root.path())?;
        let data = serde_json::to_vec_pretty(spec).unwrap_or_default();
        let file = file_name(uid);
        root.replace(&file, &data, 0o644)?;
        let back = root.read_regular(&file, CAP)?;
        let differs = |reason: String| CdiError::ReadBack {
            file: self.root.path().join(&file).display().to_string(),
            reason,
        };
        let back: Value = serde_json::from_slice(&back).map_err(|e| differs(e.to_string()))?;
        validate(&back).map_err(|e| differs(e.to_string()))?;
        if back != *spec {
            return Err(differs("another spec".into()));
        }
        Ok(())
    }

    /// Whether claim `uid`'s spec is there.
    pub fn has(&self, uid: &str) -> bool {
        self.root.path().join(file_name(uid)).is_file()
    }

    /// Whether claim `uid`'s spec is there and is `spec` (as JSON, whatever its layout).
    pub fn holds(&self, uid: &str, spec: &Value) -> bool {
        self.root
            .read_regular(file_name(uid), CAP)
            .ok()
            .and_then(|data| serde_json::from_slice::<Value>(&data).ok())
            .is_some_and(|there| there == *spec)
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
mod tests;
