//! What a test needs from the machine besides the build: a command, a Python module, root.
//!
//! A missing need fails the test with what to install, so that `cargo test` never reports `ok`
//! for a check it did not make. On a machine that cannot have it (no root, say), set
//! `CPUPOOL_TESTS_MAY_SKIP=1`: each such test then prints a `SKIPPED:` line (shown with
//! `--nocapture`) and returns. CI never sets it.

use std::process::{Command, Stdio};

/// The environment variable that turns a missing need into a skip.
pub const MAY_SKIP: &str = "CPUPOOL_TESTS_MAY_SKIP";

/// Reports `what` as missing: `false` (the test returns) when skips are allowed, else the test
/// fails, saying what is missing and how to get it.
pub fn unavailable(what: &str, remedy: &str) -> bool {
    if std::env::var_os(MAY_SKIP).is_some_and(|v| v == "1") {
        eprintln!("SKIPPED ({MAY_SKIP}=1): this test needs {what}; {remedy}");
        return false;
    }
    panic!(
        "this test needs {what}, which this machine lacks: {remedy}. \
         README.md (\"What the tests need\") lists every need; {MAY_SKIP}=1 skips the checks \
         that need it instead"
    );
}

/// Whether `argv` runs and exits 0 (`tmux -V`, `promtool --version`); if not, see
/// [`unavailable`].
pub fn command(argv: &[&str], remedy: &str) -> bool {
    let Some((prog, args)) = argv.split_first() else {
        return unavailable("a command (none named)", remedy);
    };
    let ok = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || unavailable(&format!("`{}`", argv.join(" ")), remedy)
}

/// Whether `python3` imports `module`; if not, see [`unavailable`].
pub fn python_module(module: &str, pip: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || unavailable(
        &format!("the Python module `{module}`"),
        &format!("`python3 -m pip install {pip}` (PyPI)"),
    )
}

/// The PyPI `varlink` package, the third-party varlink client.
pub fn python_varlink() -> bool {
    python_module("varlink", "varlink")
}

/// Whether the test runs as root (effective uid 0); if not, see [`unavailable`]. `why` says
/// what root is needed for.
pub fn root(why: &str) -> bool {
    nix::unistd::geteuid().is_root()
        || unavailable(&format!("root ({why})"), "run the tests as root, as CI does")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_command_is_had() {
        assert!(command(&["true"], "-"));
    }

    #[test]
    fn a_missing_command_fails_the_test_naming_the_remedy() {
        // The variable is read per call; a test run that sets it for everything would
        // make this check moot, so it is asserted unset here.
        if std::env::var_os(MAY_SKIP).is_some() {
            return;
        }
        let text = match std::panic::catch_unwind(|| {
            command(&["/nonexistent/cpupool-test-tool"], "apt install nothing")
        }) {
            Ok(had) => panic!("a missing command passed, as had={had}"),
            Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
        };
        assert!(text.contains("/nonexistent/cpupool-test-tool"), "{text}");
        assert!(text.contains("apt install nothing"), "{text}");
        assert!(text.contains(MAY_SKIP), "{text}");
    }
}
