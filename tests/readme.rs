//! The README's "Try it" section, run as written: its `sh` blocks are taken from README.md, the
//! sandbox directory `/tmp/cpupool-demo` becomes a temp dir, and `cargo run [--release] --bin X --`
//! becomes the binary cargo built for this test run. The daemon starts as the first block says
//! and the test waits for its `READY` line; every other line runs with `sh` (after the block's
//! variable assignments), and the first that fails fails the test with its output.
//!
//! Not run: `cargo test ...` (this is one of those tests). The varlink lines need the PyPI
//! `varlink` package and are skipped, with a message, without it. The Monitor line streams until
//! stopped: it passes once it printed its first event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const DEMO: &str = "/tmp/cpupool-demo";

/// The `sh` blocks of the "Try it" section, one list of lines each.
fn try_it_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme.find("\n## Try it").expect("a \"Try it\" section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in section.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(b), l) => b.push(l.to_owned()),
            (None, _) => {}
        }
    }
    blocks
}

/// `target/debug/cpupoolctl`, next to this test's binary's directory (`target/debug/deps/`);
/// `cargo test --workspace` builds it (the README's command).
fn cpupoolctl_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("cpupoolctl");
    assert!(bin.is_file(), "{} is missing: run `cargo build --workspace` first", bin.display());
    bin
}

/// The line with the demo directory and `cargo run` replaced.
fn rewrite(line: &str, dir: &Path) -> String {
    let ctl = cpupoolctl_bin();
    line.replace(DEMO, &dir.display().to_string())
        .replace("cargo run --release --bin cpupoold --", env!("CARGO_BIN_EXE_cpupoold"))
        .replace("cargo run --bin cpupoold --", env!("CARGO_BIN_EXE_cpupoold"))
        .replace("cargo run --release --bin cpupoolctl --", &ctl.display().to_string())
        .replace("cargo run --bin cpupoolctl --", &ctl.display().to_string())
}

fn python_varlink() -> bool {
    Command::new("python3").args(["-c", "import varlink"]).status().is_ok_and(|s| s.success())
}

#[test]
fn every_try_it_example_works() {
    let blocks = try_it_blocks();
    assert!(blocks.len() >= 4, "{blocks:?}");
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("cpupool-demo");

    // The first block: the daemon (kept running), and the test suite (not run from here).
    let start = blocks[0]
        .iter()
        .find(|l| l.contains("--bin cpupoold") && l.contains("--sandbox"))
        .expect("the daemon's line");
    let mut daemon = Command::new("sh")
        .args(["-c", &format!("exec {}", rewrite(start, &demo))])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    for line in BufReader::new(daemon.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        banner.push_str(&line);
        banner.push('\n');
        if line == "READY" {
            break;
        }
    }
    let guard = Kill(daemon);
    assert!(banner.ends_with("READY\n"), "`{start}` printed no READY:\n{banner}");

    let varlink = python_varlink();
    let mut ran = Vec::new();
    for block in &blocks[1..] {
        let mut vars = String::new();
        for line in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let cmd = rewrite(line, &demo);
            if line
                .split('=')
                .next()
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_uppercase()))
            {
                vars.push_str(&cmd);
                vars.push('\n');
                continue;
            }
            if line.contains("varlink.cli") && !varlink {
                eprintln!("SKIPPED: `python3 -c 'import varlink'` failed (pip install varlink): {line}");
                continue;
            }
            let script = format!("{vars}{cmd}");
            if line.contains("--more") {
                first_line_of_stream(&format!("{vars}exec {cmd}"), line);
            } else {
                let out = Command::new("sh").args(["-c", &script]).output().unwrap();
                assert!(
                    out.status.success(),
                    "README line failed ({}):\n  {line}\nstdout:\n{}\nstderr:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            ran.push(line.to_owned());
        }
    }
    eprintln!("ran {} README lines:\n  {}", ran.len(), ran.join("\n  "));
    assert!(ran.len() >= 12, "{ran:?}");
    drop(guard);
}

/// Runs a streaming command until its first line of output (at most 30 s), then stops it.
fn first_line_of_stream(script: &str, line: &str) {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = BufReader::new(stdout).read_line(&mut first);
        let _ = tx.send(first);
    });
    let first = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    assert!(!first.trim().is_empty(), "README line printed nothing:\n  {line}\nstderr:\n{err}");
}

/// Stops the daemon (SIGTERM, so that it stops the sandbox's bus too) when the test ends,
/// also after a failure.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}
