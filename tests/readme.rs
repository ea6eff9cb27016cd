//! The README's "Try it" section, run as written: its `sh` blocks are taken from README.md, the
//! sandbox directory `/tmp/cpupool-demo` becomes a temp dir, and `cargo run --bin X --`
//! becomes the binary cargo built for this test run. The daemon starts as the first block says
//! and the test waits for its `READY` line; every other line runs with `sh` (after the block's
//! variable assignments), and the first that fails fails the test with its output.
//!
//! `cargo run --example kubelet_peer --` becomes the example cargo built (`--all-targets`).
//!
//! Every `cpupoolctl` example of the help texts, the man pages and `docs/` runs too, each
//! document's in order against a fresh sandbox ([`run_examples`] says how lines are adapted).
//!
//! The other tests here check what cannot run in the sandbox: every `toml` block of the README
//! and of `docs/` loads with the real configuration parser; every `cpupoolctl` line of their
//! `sh` blocks parses with cpupoolctl's real argument parser; the interface tables of
//! `docs/interfaces.md` match the varlink IDL and the D-Bus introspection XML, and its table of
//! `deploy/` names every file there; the README leads to every document of `docs/`; every test
//! and bench target named exists; relative links
//! resolve, and every repository path named in backticks exists; and the README stays a guide
//! (under 25 KB).
//!
//! Not run: `cargo test ...` (this is one of those tests). The varlink lines need the PyPI
//! `varlink` package (`test_support::needs`: the test fails without it, or skips them with
//! `CPUPOOL_TESTS_MAY_SKIP=1`). The Monitor line streams until
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

/// The README shows the sandbox's banner as it is printed: line for line, with the sandbox
/// directory in place of `/tmp/cpupool-demo` and anything from `<pid>` or `<port>` on unchecked.
fn readme_banner_is_printed(printed: &str, demo: &Path) {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let shown = blocks(&readme, "")
        .into_iter()
        .find(|b| b.starts_with("cpupoold sandbox ready:"))
        .expect("the README shows the sandbox's banner");
    let printed: Vec<&str> =
        printed.lines().skip_while(|l| !l.starts_with("cpupoold sandbox ready:")).collect();
    let shown: Vec<String> =
        shown.lines().map(|l| l.replace("/tmp/cpupool-demo", &demo.display().to_string())).collect();
    assert_eq!(
        printed.len(),
        shown.len(),
        "the README's banner:\n{}\nprinted:\n{}",
        shown.join("\n"),
        printed.join("\n")
    );
    for (p, s) in printed.iter().zip(&shown) {
        let fixed = s.find(['<']).map_or(s.as_str(), |i| &s[..i]);
        let same = if fixed.len() < s.len() { p.starts_with(fixed) } else { p == s };
        assert!(same, "the README's banner shows\n  {s}\nwhere the sandbox printed\n  {p}");
    }
}

/// `target/debug/cpupoolctl`, next to this test's binary's directory (`target/debug/deps/`);
/// `cargo test --workspace` builds it (the README's command).
fn cpupoolctl_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("cpupoolctl");
    assert!(bin.is_file(), "{} is missing: run `cargo build --workspace` first", bin.display());
    bin
}

/// `target/debug/examples/kubelet_peer`, the program `cargo run --example kubelet_peer` runs.
/// `cargo test --all-targets` builds examples only as test harnesses, so on a clean tree it is
/// built here, once, by the cargo running this test (it holds no lock while tests run).
fn kubelet_peer_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let bin = exe.parent().and_then(Path::parent).unwrap().join("examples/kubelet_peer");
            let cargo = option_env!("CARGO").unwrap_or("cargo");
            let status = Command::new(cargo)
                .args(["build", "--quiet", "--example", "kubelet_peer", "--manifest-path"])
                .arg(root().join("Cargo.toml"))
                .status()
                .unwrap_or_else(|e| panic!("{cargo} build --example kubelet_peer: {e}"));
            assert!(status.success(), "cargo build --example kubelet_peer: {status}");
            assert!(bin.is_file(), "{} is missing after building it", bin.display());
            bin
        })
        .clone()
}

/// The line with the demo directory and `cargo run` replaced.
fn rewrite(line: &str, dir: &Path) -> String {
    let ctl = cpupoolctl_bin();
    let line = if line.contains("cargo run --example kubelet_peer --") {
        line.replace("cargo run --example kubelet_peer --", &kubelet_peer_bin().display().to_string())
    } else {
        line.to_owned()
    };
    line.replace(DEMO, &dir.display().to_string())
        .replace("cargo run --bin cpupoold --", env!("CARGO_BIN_EXE_cpupoold"))
        .replace("cargo run --bin cpupoolctl --", &ctl.display().to_string())
}

fn python_varlink() -> bool {
    test_support::needs::python_varlink()
}

/// The tour's `cargo run` lines share one profile (`dev`, as `cargo test`): a `--release` among
/// them would build the whole tree a second time before the newcomer sees anything.
#[test]
fn the_tour_builds_in_one_profile() {
    let lines: Vec<String> = try_it_blocks().concat();
    assert!(lines.iter().any(|l| l.contains("cargo run")), "{lines:?}");
    for line in lines.iter().filter(|l| l.contains("cargo ")) {
        assert!(!line.contains("--release") && !line.contains("--profile"), "another profile: {line}");
    }
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
    readme_banner_is_printed(&banner, &demo);

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
                eprintln!("SKIPPED (CPUPOOL_TESTS_MAY_SKIP=1): needs the PyPI varlink package: {line}");
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
    assert!(ran.len() >= 16, "{ran:?}");
    drop(guard);
}

/// Starts `cmd` with its output piped, waits for its first line (at most 30 s) and stops it:
/// that line (empty if none came) and what it wrote to stderr.
fn first_line(cmd: &mut Command) -> (String, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = BufReader::new(stdout).read_line(&mut first);
        let _ = tx.send(first);
    });
    let first = rx.recv_timeout(test_support::wait::PATIENCE).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    (first, err)
}

/// Runs a streaming command until its first line of output (at most 30 s), then stops it.
fn first_line_of_stream(script: &str, line: &str) {
    let (first, err) = first_line(Command::new("sh").args(["-c", script]));
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

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown file under docs/, as (path relative to the root, text).
fn documents() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut paths = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut paths);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.strip_prefix(root()).unwrap().to_owned(), text)
        })
        .collect()
}

/// The fenced blocks of a Markdown text whose info string is `lang`, one string each.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<(bool, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) => current = Some((info.trim() == lang, String::new())),
            (Some(_), Some(_)) => {
                let (wanted, block) = current.take().unwrap();
                if wanted {
                    out.push(block);
                }
            }
            (Some((_, block)), None) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn readme_is_a_guide_under_25_kb() {
    let len = std::fs::metadata(root().join("README.md")).unwrap().len();
    assert!(len < 25 * 1024, "README.md is {len} bytes: move reference material to docs/");
}

/// Every `toml` block loads with the real parser: a full configuration as it is, a drop-in
/// (a block without a reserved pool) on top of a base holding the pools the drop-ins edit, as
/// the daemon would merge it.
#[test]
fn every_toml_block_in_the_docs_loads() {
    const BASE: &str = "[pools.reserved]\nkind = \"reserved\"\ncount = 1\n\n\
                        [pools.dp]\nkind = \"exclusive\"\ncount = 4\n\n\
                        [pools.batch]\nkind = \"exclusive\"\ncount = 2\n";
    let mut loaded = 0;
    for (path, text) in documents() {
        for block in blocks(&text, "toml") {
            let full = block.contains("\"reserved\"");
            let name = path.display().to_string();
            let fragments: Vec<(&str, &str)> =
                if full { vec![(&name, &block)] } else { vec![("base.toml", BASE), (&name, &block)] };
            if let Err(e) = cpupoold::config::load_strs(&fragments) {
                panic!("a toml block of {name} does not load: {e}\n{block}");
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 6, "only {loaded} toml blocks");
}

/// The `cpupoolctl` command of a documentation line (after `sudo`, up to a comment, pipe or
/// redirection), with `cargo run --bin cpupoolctl --` as `cpupoolctl`; `None` for other lines.
fn cpupoolctl_command(line: &str) -> Option<String> {
    let line = line.trim().replace("cargo run --bin cpupoolctl --", "cpupoolctl");
    let line = line.strip_prefix("sudo ").unwrap_or(&line);
    let rest = line.strip_prefix("cpupoolctl ")?;
    let end = [" #", " |", " >", " &&", " ;"].iter().filter_map(|s| rest.find(s)).min().unwrap_or(rest.len());
    Some(rest[..end].trim().to_owned())
}

/// Runs cpupoolctl with `args` (shell words) where no daemon can be reached: exit 2 is a usage
/// error, anything else means the arguments parsed.
fn cpupoolctl_parses(args: &str, nowhere: &Path) -> Result<(), String> {
    let global = ["--sandbox", "--dbus", "--bus", "--varlink-address"];
    let args = args.replace(DEMO, &nowhere.display().to_string());
    // Global options go before the subcommand, where clap takes them whatever the subcommand.
    let args = if global.iter().any(|g| args.split_whitespace().any(|w| w == *g)) {
        args
    } else {
        format!("--varlink-address unix:{} {args}", nowhere.join("socket").display())
    };
    let bus = format!("unix:path={}", nowhere.join("bus").display());
    let out = Command::new("sh")
        .args(["-c", &format!("exec \"$0\" --timeout 2 {args}"), &cpupoolctl_bin().display().to_string()])
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
        .env("DBUS_SESSION_BUS_ADDRESS", &bus)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    match out.status.code() {
        Some(2) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        _ => Ok(()),
    }
}

#[test]
fn every_cpupoolctl_line_in_the_docs_parses() {
    let nowhere = tempfile::tempdir().unwrap();
    let nowhere = nowhere.path().join("no-daemon-here");
    // The check can fail: a wrong option is a usage error.
    assert!(cpupoolctl_parses("pool list --no-such-option", &nowhere).is_err());
    assert!(cpupoolctl_parses("pool create batch --kind exclusive [--isolate]", &nowhere).is_err());
    let mut checked = Vec::new();
    let mut failed = Vec::new();
    for (path, text) in documents() {
        for block in blocks(&text, "sh") {
            for line in block.lines() {
                let Some(args) = cpupoolctl_command(line) else { continue };
                if let Err(e) = cpupoolctl_parses(&args, &nowhere) {
                    failed.push(format!("{}: cpupoolctl {args}\n{e}", path.display()));
                }
                checked.push(args);
            }
        }
    }
    assert!(failed.is_empty(), "lines cpupoolctl does not accept:\n{}", failed.join("\n"));
    eprintln!("{} cpupoolctl lines parse", checked.len());
    assert!(checked.len() >= 25, "{checked:?}");
}

/// The rows of the Markdown table whose header line is `header`: the first cell of each, with
/// the table ending at the first line that is not a row (so a blank line cuts it short).
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let start =
        text.lines().position(|l| l.trim() == header).unwrap_or_else(|| panic!("no table `{header}`"));
    text.lines()
        .skip(start + 2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let l = l.trim().trim_start_matches('|').trim_end_matches('|').replace("\\|", "\u{1}");
            l.split('|').map(|c| c.trim().replace('\u{1}', "|")).collect()
        })
        .collect()
}

/// The name in a cell such as "`Assign(pool, ...) -> (assignment)`" or "`Pools` property".
fn cell_name(cell: &str) -> String {
    let inner = cell.trim_start_matches('`');
    inner.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("").to_owned()
}

#[test]
fn interfaces_doc_matches_the_idl() {
    let idl = std::fs::read_to_string(root().join("cpupool-wire/org.cpupool.Manager.varlink")).unwrap();
    let doc = std::fs::read_to_string(root().join("docs/interfaces.md")).unwrap();
    let words = |prefix: &str| -> Vec<String> {
        idl.lines().filter_map(|l| l.strip_prefix(prefix)).map(cell_name).collect()
    };
    let (methods, errors) = (words("method "), words("error "));
    assert!(methods.len() >= 15 && errors.len() >= 20, "{methods:?} {errors:?}");

    // Methods: every one in the one table, in a row naming its parameters as the IDL does.
    let rows = table(&doc, "| method | what |");
    let documented: Vec<String> = rows.iter().map(|r| cell_name(&r[0])).collect();
    assert_eq!(
        documented.iter().collect::<std::collections::BTreeSet<_>>(),
        methods.iter().collect(),
        "docs/interfaces.md's varlink method table against the IDL"
    );
    for row in &rows {
        let name = cell_name(&row[0]);
        let decl =
            idl[idl.find(&format!("method {name}(")).unwrap()..].split(") ->").next().unwrap().to_owned();
        let params: Vec<String> = decl
            .split_once('(')
            .unwrap()
            .1
            .split(',')
            .filter_map(|p| p.split_once(':'))
            .map(|(n, ty)| format!("{}{}", n.trim(), if ty.trim().starts_with('?') { "?" } else { "" }))
            .collect();
        let shown = row[0].split_once('(').unwrap().1.split(')').next().unwrap();
        let shown: Vec<String> =
            shown.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect();
        assert_eq!(shown, params, "docs/interfaces.md: the parameters of varlink `{name}`");
    }

    // Errors: every one, with its parameters.
    let rows = table(&doc, "| error | parameters | when |");
    let documented: Vec<String> = rows.iter().map(|r| cell_name(&r[0])).collect();
    assert_eq!(documented, errors, "docs/interfaces.md's varlink error table against the IDL, in its order");
    for row in &rows {
        let name = cell_name(&row[0]);
        let decl = idl.lines().find(|l| l.starts_with(&format!("error {name} "))).unwrap();
        let params: Vec<&str> = decl
            .split_once('(')
            .unwrap()
            .1
            .trim_end_matches(')')
            .split(',')
            .filter_map(|p| p.split_once(':').map(|(n, _)| n.trim()))
            .collect();
        let shown: Vec<&str> =
            row[1].split(',').map(|p| p.trim().trim_matches('`')).filter(|p| !p.is_empty()).collect();
        assert_eq!(shown, params, "docs/interfaces.md: the parameters of error `{name}`");
    }

    // The mutating methods: the IDL's header says which need the admin group.
    let header = idl.split("need root").next().unwrap();
    let header = header.rsplit("Reads are open to everyone;").next().unwrap();
    let mut mutating: Vec<String> = header
        .split([',', ' ', '\n', '#'])
        .filter(|w| !w.is_empty() && *w != "and")
        .map(str::to_owned)
        .collect();
    mutating.sort();
    let sentence = doc.split("The mutating methods (").nth(1).unwrap().split(')').next().unwrap();
    let mut shown: Vec<String> = sentence.split(',').map(|w| w.trim().trim_matches('`').to_owned()).collect();
    shown.sort();
    assert_eq!(shown, mutating, "docs/interfaces.md: the varlink mutating methods against the IDL's header");
}

#[test]
fn interfaces_doc_matches_the_dbus_xml() {
    let xml = std::fs::read_to_string(root().join("dbus/org.cpupool.Manager1.xml")).unwrap();
    let doc = std::fs::read_to_string(root().join("docs/interfaces.md")).unwrap();
    let parsed = roxmltree::Document::parse_with_options(
        &xml,
        roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() },
    )
    .unwrap();
    let mut expected = std::collections::BTreeMap::new();
    for node in parsed.descendants().filter(|n| n.has_tag_name("interface")).flat_map(|i| i.children()) {
        let Some(name) = node.attribute("name") else { continue };
        let sig = |dir: Option<&str>| -> String {
            node.children()
                .filter(|a| a.has_tag_name("arg") && (dir.is_none() || a.attribute("direction") == dir))
                .filter_map(|a| a.attribute("type"))
                .collect()
        };
        let (key, sig) = match node.tag_name().name() {
            "method" => {
                let (i, o) = (sig(Some("in")), sig(Some("out")));
                (
                    name.to_owned(),
                    match (i.is_empty(), o.is_empty()) {
                        (true, _) => format!("→ {o}"),
                        (false, true) => format!("{i} →"),
                        (false, false) => format!("{i} → {o}"),
                    },
                )
            }
            "signal" => (format!("{name} signal"), sig(None)),
            "property" => (format!("{name} property"), node.attribute("type").unwrap().to_owned()),
            _ => continue,
        };
        expected.insert(key, sig);
    }
    assert!(expected.len() >= 19, "{expected:?}");
    let shown: std::collections::BTreeMap<String, String> = table(&doc, "| member | signature | what |")
        .into_iter()
        .map(|r| (r[0].replace('`', ""), r[1].trim_matches('`').to_owned()))
        .collect();
    assert_eq!(shown, expected, "docs/interfaces.md's D-Bus table against dbus/org.cpupool.Manager1.xml");
}

/// The test and bench targets a text names (`cargo test --test NAME`, `cargo test -p PKG --test
/// NAME`, `cargo bench --bench NAME`), as the files cargo builds them from.
fn named_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        for (flag, dir) in [("--test ", "tests"), ("--bench ", "benches")] {
            for (at, _) in line.match_indices(flag) {
                let name: String = line[at + flag.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `-p PKG` of the same command: after its `cargo`.
                let command = line[..at].rsplit_once("cargo ").map_or(&line[..at], |(_, c)| c);
                let package = command.rsplit_once("-p ").and_then(|(_, p)| p.split_whitespace().next());
                let base = package.filter(|p| *p != "cpupoold").map_or(String::new(), |p| format!("{p}/"));
                if !name.is_empty() {
                    out.push(format!("{base}{dir}/{name}.rs"));
                }
            }
        }
    }
    out
}

#[test]
fn every_test_and_bench_the_guides_name_exists() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for (rel, text) in documents() {
        for file in named_targets(&text) {
            seen += 1;
            if !root().join(&file).is_file() {
                problems.push(format!(
                    "{} names a target built from `{file}`, which does not exist",
                    rel.display()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(seen >= 20, "{seen}");
    assert_eq!(
        named_targets(
            "`cargo test -p cpupoolctl --test e2e`, `cargo test --features k8s --test dra` and `--bench api`"
        ),
        ["cpupoolctl/tests/e2e.rs", "tests/dra.rs", "benches/api.rs"]
    );
}

/// The README's "Where to read on" table leads to every document of docs/ and to the ADRs.
#[test]
fn the_readme_leads_to_every_document() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let rows: Vec<String> = table(&readme, "| document | what |").into_iter().map(|r| r[0].clone()).collect();
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("(docs/{n})"))
        .collect();
    docs.push("(docs/decisions/)".to_owned());
    docs.sort();
    assert!(docs.len() >= 8, "{docs:?}");
    let missing: Vec<&String> =
        docs.iter().filter(|d| !rows.iter().any(|r| r.contains(d.as_str()))).collect();
    assert!(missing.is_empty(), "the README's \"Where to read on\" does not lead to {missing:?}");
}

/// docs/interfaces.md's table of `deploy/` names every file shipped there, so none is left
/// without a word on what it is.
#[test]
fn the_deploy_table_names_every_file_of_deploy() {
    let doc = std::fs::read_to_string(root().join("docs/interfaces.md")).unwrap();
    let named: Vec<String> = table(&doc, "| file | what |")
        .into_iter()
        .flat_map(|row| row[0].split('`').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>())
        .collect();
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("deploy"), &root().join("deploy"), &mut files);
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    let unnamed: Vec<&String> = files.iter().filter(|f| !named.contains(f)).collect();
    assert!(unnamed.is_empty(), "docs/interfaces.md's table of deploy/ does not name {unnamed:?}");
    let missing: Vec<&String> = named.iter().filter(|n| !files.contains(n)).collect();
    assert!(missing.is_empty(), "docs/interfaces.md's table of deploy/ names {missing:?}, not in deploy/");
}

/// Relative links in the README and the docs point at files that exist.
#[test]
fn relative_links_resolve() {
    let mut broken = Vec::new();
    let mut seen = 0;
    for (path, text) in documents() {
        let dir = root().join(&path).parent().unwrap().to_owned();
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let file = target.split('#').next().unwrap();
            seen += 1;
            if !dir.join(file).exists() {
                broken.push(format!("{}: {target}", path.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
    assert!(seen >= 20, "{seen}");
}

/// A `cpupoolctl` example as written, and where: `FILE:LINE`.
struct Example {
    at: String,
    line: String,
}

/// What an example is to do in the sandbox, as its comment says: succeed; or, marked
/// `needs systemd`, be refused because the sandbox has none; or, marked `fails: ERROR`, be
/// refused with that error.
fn expected_refusal(line: &str) -> Option<String> {
    let comment = line.split_once(" #").map(|(_, c)| c)?;
    if comment.contains("needs systemd") {
        return Some("unit targets need systemd".to_owned());
    }
    let error = comment.split("fails: ").nth(1)?;
    let name: String = error.chars().take_while(char::is_ascii_alphanumeric).collect();
    Some(format!("error {name}"))
}

/// The line of `file` (relative to the root) that holds `text`, as `file:LINE`.
fn source_line(files: &[&str], text: &str) -> Option<String> {
    files.iter().find_map(|f| {
        let body = std::fs::read_to_string(root().join(f)).ok()?;
        let n = body.lines().position(|l| l.contains(text))?;
        Some(format!("{f}:{}", n + 1))
    })
}

/// The examples of `cpupoolctl --help` and of every subcommand's `--help`: the lines of an
/// `Examples:` section and every `` `cpupoolctl ...` `` span, once each, with the line of
/// cpupoolctl's source that holds them.
fn help_examples() -> Vec<Example> {
    let sources = ["cpupoolctl/src/cli.rs", "cpupoolctl/src/manpage.rs"];
    let mut found: Vec<Example> = Vec::new();
    let mut add = |line: String, shown: &str| {
        if !found.iter().any(|e| e.line == line) {
            let at = source_line(&sources, &line).unwrap_or_else(|| shown.to_owned());
            found.push(Example { at, line });
        }
    };
    let mut todo: std::collections::VecDeque<Vec<String>> = [Vec::new()].into();
    while let Some(path) = todo.pop_front() {
        let out = Command::new(cpupoolctl_bin()).args(&path).arg("--help").output().unwrap();
        assert!(out.status.success(), "cpupoolctl {path:?} --help: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let shown =
            format!("`cpupoolctl {}--help`", path.iter().map(|p| format!("{p} ")).collect::<String>());
        let mut section = "";
        for line in text.lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                section = line;
                continue;
            }
            let item = line.strip_prefix("  ").filter(|l| !l.starts_with(' '));
            match (section, item) {
                ("Commands:", Some(name)) => {
                    let name = name.split_whitespace().next().unwrap_or_default();
                    if name != "help" {
                        todo.push_back([path.clone(), vec![name.to_owned()]].concat());
                    }
                }
                ("Examples:", Some(example)) if example.starts_with("cpupoolctl ") => {
                    add(example.trim().to_owned(), &shown)
                }
                _ => {}
            }
        }
        // Spans, with the help's line breaks undone.
        let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for span in joined.split('`').skip(1).step_by(2).filter(|s| s.starts_with("cpupoolctl ")) {
            add(span.to_owned(), &shown);
        }
    }
    found
}

/// The `cpupoolctl` lines of the `.nf`/`.fi` and `.EX`/`.EE` blocks of the man pages: those
/// `cpupoolctl manpage --dir` writes (found in cpupoolctl's source when they are there), and
/// those under packaging/; one list per page that has any.
fn man_examples(scratch: &Path) -> Vec<(String, Vec<Example>)> {
    let generated = scratch.join("man");
    let out = Command::new(cpupoolctl_bin()).arg("manpage").arg("--dir").arg(&generated).output().unwrap();
    assert!(out.status.success(), "cpupoolctl manpage --dir: {}", String::from_utf8_lossy(&out.stderr));
    let mut pages: Vec<(PathBuf, String)> = Vec::new();
    for dir in [generated.clone(), root().join("packaging")] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e.len() == 1)) {
            let shown = match f.strip_prefix(root()) {
                Ok(rel) => rel.display().to_string(),
                Err(_) => format!("`cpupoolctl manpage --dir`: {}", f.file_name().unwrap().to_string_lossy()),
            };
            pages.push((f, shown));
        }
    }
    assert!(pages.len() >= 10, "{pages:?}");
    let mut all = Vec::new();
    for (page, shown) in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut inside = false;
        let mut found = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            match raw.trim() {
                ".nf" | ".EX" => inside = true,
                ".fi" | ".EE" => inside = false,
                _ if inside => {
                    let line = raw.replace("\\-", "-").replace("\\e", "\\").replace("\\\\", "\\");
                    if line
                        .trim_start()
                        .strip_prefix("sudo ")
                        .unwrap_or(line.trim_start())
                        .starts_with("cpupoolctl ")
                    {
                        let at =
                            source_line(&["cpupoolctl/src/cli.rs", "cpupoolctl/src/manpage.rs"], line.trim())
                                .unwrap_or_else(|| format!("{shown}:{}", i + 1));
                        found.push(Example { at, line: line.trim().to_owned() });
                    }
                }
                _ => {}
            }
        }
        if !found.is_empty() {
            all.push((shown, found));
        }
    }
    all
}

/// The `cpupoolctl` lines of the `sh` blocks of docs/, one list per document that has any.
fn doc_examples() -> Vec<(String, Vec<Example>)> {
    let mut all = Vec::new();
    for (path, text) in documents().into_iter().filter(|(p, _)| p.starts_with("docs")) {
        let mut in_sh: Option<bool> = None;
        let mut found = Vec::new();
        for (i, line) in text.lines().enumerate() {
            match (in_sh, line.trim_start().strip_prefix("```")) {
                (None, Some(info)) => in_sh = Some(info.trim() == "sh"),
                (Some(_), Some(_)) => in_sh = None,
                (Some(true), None) if cpupoolctl_command(line).is_some() => found.push(Example {
                    at: format!("{}:{}", path.display(), i + 1),
                    line: line.trim().to_owned(),
                }),
                _ => {}
            }
        }
        if !found.is_empty() {
            all.push((path.display().to_string(), found));
        }
    }
    all
}

/// Runs `examples` in order against a fresh sandbox daemon (`cpupoold --sandbox`, as the README
/// starts it), each line with `sh` as written except: `cpupoolctl` is the binary cargo built,
/// `--sandbox DIR` is added where the line names no daemon, `/tmp/cpupool-demo` is the
/// sandbox, `sudo` goes, the `--cgroup` directory is made in the sandbox's cgroupfs (as the
/// user makes it), and a redirection to a file outside the sandbox goes to a scratch file.
/// `monitor` passes once it printed its first event; `top` runs in a tmux pane until it drew
/// its pools, and must quit on q. Returns the failures.
fn run_examples(document: &str, examples: &[Example]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let sb = dir.path().join("sb");
    let log = dir.path().join("daemon.log");
    let spawned = test_support::daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_cpupoold")),
        &sb,
        cpupoold::sandbox::DEFAULT_SHAPE,
        &[],
        &log,
    );
    let daemon = Kill(spawned.child);
    assert!(spawned.ready, "{document}: the sandbox printed no READY:\n{}", spawned.banner);
    let bin_dir = cpupoolctl_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let sbs = sb.display().to_string();
    let mut failures = Vec::new();
    for (n, ex) in examples.iter().enumerate() {
        let written = ex.line.split(" #").next().unwrap_or_default().trim();
        let written = written.strip_prefix("sudo ").unwrap_or(written);
        let addressed = ["--sandbox", "--varlink-address", "--bus"]
            .iter()
            .any(|o| written.split_whitespace().any(|w| w == *o || w.starts_with(&format!("{o}="))));
        let mut cmd = written.replace(DEMO, &sbs);
        if !addressed {
            cmd = cmd.replacen("cpupoolctl ", &format!("cpupoolctl --sandbox {sbs} "), 1);
        }
        let words: Vec<&str> = written.split_whitespace().collect();
        for pair in words.windows(2) {
            match pair {
                ["--cgroup", cg] => std::fs::create_dir_all(sb.join("cgroup").join(cg)).unwrap(),
                [">", file] if file.starts_with('/') && !file.starts_with(DEMO) => {
                    let scratch = dir.path().join(format!("redirected-{n}"));
                    cmd = cmd.replace(&format!("> {file}"), &format!("> {}", scratch.display()));
                }
                _ => {}
            }
        }
        if words.contains(&"man")
            && !test_support::needs::command(&["man", "--version"], "`apt install man-db`")
        {
            continue;
        }
        let refusal = expected_refusal(&ex.line);
        let outcome = if words.contains(&"monitor") {
            stream_prints(&cmd, &path)
        } else if words.contains(&"top") {
            top_runs_and_quits(&cmd, &path, dir.path())
        } else {
            let out = Command::new("sh")
                .args(["-c", &cmd])
                .env("PATH", &path)
                .env("MANPAGER", "cat")
                .env("PAGER", "cat")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let said = format!(
                "exit {}\nstdout:\n{}stderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            match &refusal {
                None if out.status.success() => Ok(()),
                None => Err(said),
                Some(why)
                    if out.status.code() == Some(1)
                        && String::from_utf8_lossy(&out.stderr).contains(why.as_str()) =>
                {
                    Ok(())
                }
                Some(why) => Err(format!("expected a refusal saying `{why}` (exit 1); {said}")),
            }
        };
        if let Err(e) = outcome {
            failures.push(format!("{}: {}\n  ran: {cmd}\n  {}", ex.at, ex.line, e.replace('\n', "\n  ")));
        }
    }
    drop(daemon);
    failures
}

/// A streaming command: passes once it printed a line (within 30 s).
fn stream_prints(cmd: &str, path: &str) -> Result<(), String> {
    let (first, err) = first_line(Command::new("sh").args(["-c", &format!("exec {cmd}")]).env("PATH", path));
    if first.trim().is_empty() {
        Err(format!("printed nothing; stderr:\n{err}"))
    } else {
        Ok(())
    }
}

/// `top` in a tmux pane of its own server: it must draw the pools, then quit on q with 0.
fn top_runs_and_quits(cmd: &str, path: &str, dir: &Path) -> Result<(), String> {
    if !test_support::needs::command(&["tmux", "-V"], "`apt install tmux`") {
        return Ok(());
    }
    let socket = dir.join("tmux.sock");
    let tmux = |args: &[&str]| {
        Command::new("tmux").arg("-S").arg(&socket).args(args).env("PATH", path).output().unwrap()
    };
    let script = dir.join("top.sh");
    std::fs::write(&script, format!("{cmd}\necho \"exited=$?\"\nread x\n")).unwrap();
    let started =
        tmux(&["new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "sh", script.to_str().unwrap()]);
    if !started.status.success() {
        return Err(format!("tmux: {}", String::from_utf8_lossy(&started.stderr)));
    }
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned();
    let deadline = std::time::Instant::now() + test_support::wait::PATIENCE;
    let result = loop {
        let s = screen();
        if s.contains(" pools ") && s.contains("q quits") {
            tmux(&["send-keys", "-t", "t", "q"]);
        }
        if s.contains("exited=") {
            break if s.contains("exited=0") { Ok(()) } else { Err(format!("screen:\n{s}")) };
        }
        if std::time::Instant::now() > deadline {
            break Err(format!("did not draw and quit within 30 s; screen:\n{s}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    tmux(&["kill-server"]);
    result
}

/// Every `cpupoolctl` example of the help texts, the man pages and docs/ works: each
/// document's examples run in order against a fresh sandbox, as [`run_examples`] says, and
/// every failure is reported with its file and line.
#[test]
fn every_cpupoolctl_example_runs() {
    let scratch = tempfile::tempdir().unwrap();
    let mut documents: Vec<(String, Vec<Example>)> = vec![("`--help`".to_owned(), help_examples())];
    documents.extend(man_examples(scratch.path()));
    documents.extend(doc_examples());
    let count =
        |name: &str| documents.iter().filter(|(d, _)| d.contains(name)).map(|(_, e)| e.len()).sum::<usize>();
    assert!(count("--help") >= 10, "help examples: {}", count("--help"));
    assert!(count("manpage") >= 9, "man page examples: {}", count("manpage"));
    assert!(
        count("docs/interfaces.md") >= 20,
        "docs/interfaces.md examples: {}",
        count("docs/interfaces.md")
    );
    let mut failures = Vec::new();
    let mut ran = 0;
    for (document, examples) in &documents {
        failures.extend(run_examples(document, examples));
        ran += examples.len();
    }
    eprintln!("ran {ran} cpupoolctl examples from {} documents", documents.len());
    assert!(failures.is_empty(), "{} of {ran} examples failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// The `sh` block of docs/dra.md's "Try it on one machine", as lines.
#[cfg(feature = "k8s")]
fn dra_try_it_lines() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/dra.md")).unwrap();
    let start = doc.find("\n## Try it on one machine").expect("a \"Try it on one machine\" section");
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let found = blocks(section, "sh");
    assert_eq!(found.len(), 1, "one sh block: {found:?}");
    found[0].lines().map(str::to_owned).collect()
}

/// docs/dra.md's "Try it on one machine", run as written, as one `sh -e` script (the lines
/// share the shell's variables and its fd 7): `/tmp/cpupool-dra` becomes a temp dir,
/// `target/debug/X` the binaries cargo built for this run (the examples built here with the
/// `k8s` feature, as the section's `cargo build` lines build them; those lines are not run).
/// The fake API server is the project's fake, named so in the section; the rest is real.
#[cfg(feature = "k8s")]
#[test]
fn docs_dra_try_it_on_one_machine_with_the_fake_apiserver_works() {
    use std::os::unix::process::CommandExt;
    let lines = dra_try_it_lines();
    let (builds, run): (Vec<&String>, Vec<&String>) =
        lines.iter().partition(|l| l.starts_with("cargo build"));
    assert_eq!(builds.len(), 2, "{builds:?}");
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(Path::parent).unwrap().to_owned();
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--features",
            "k8s",
            "--example",
            "fake_apiserver",
            "--example",
            "kubelet_peer",
        ])
        .arg("--manifest-path")
        .arg(root().join("Cargo.toml"))
        .status()
        .unwrap();
    assert!(status.success(), "cargo build --example fake_apiserver --example kubelet_peer: {status}");
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("cpupool-dra");
    let script: String = run
        .iter()
        .map(|l| {
            l.replace("/tmp/cpupool-dra", &demo.display().to_string())
                .replace("target/debug/cpupoold", env!("CARGO_BIN_EXE_cpupoold"))
                .replace("target/debug/cpupoolctl", &cpupoolctl_bin().display().to_string())
                .replace("target/debug/examples/", &format!("{}/examples/", debug.display()))
                + "\n"
        })
        .collect();
    let child = Command::new("sh")
        .args(["-e", "-c", &script])
        .current_dir(root())
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let out = child.wait_with_output().unwrap();
    // Whatever the script left running (it stops both itself when it gets to its end).
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(demo.join("daemon.log")).unwrap_or_default();
    let said = format!("stdout:\n{stdout}\nstderr:\n{stderr}\ndaemon.log:\n{log}");
    assert!(out.status.success(), "{}\n{said}", out.status);
    let uid = "3f2b8c1e-9a47-4d0b-b6e2-5c81f0a9d7e4";
    assert!(stdout.contains(&format!("\"cdi_devices\":[\"dra.cpupool.io/cpu={uid}\"]")), "{said}");
    let booked =
        stdout.lines().find(|l| l.starts_with(&format!("dra-{uid}-0 "))).unwrap_or_else(|| panic!("{said}"));
    assert!(booked.split_whitespace().nth(1) == Some("dp"), "{booked}");
    assert!(stdout.contains("CPUPOOL_CPUS="), "the CDI spec: {said}");
}

/// The repository paths a text names in backticks (`src/host/store.rs`, `tests/vm/run`,
/// `src/api/varlink.rs:120`), cut at a `:line` or `::item`.
fn named_paths(text: &str) -> Vec<String> {
    const TOPS: &[&str] = &[
        "src/",
        "tests/",
        "benches/",
        "cpupoolctl/",
        "cpupool-wire/",
        "test-support/",
        "packaging/",
        "dbus/",
        "proto/",
        "deploy/",
        "fuzz/",
        ".ci/",
    ];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| TOPS.iter().any(|t| s.starts_with(t)))
        .filter(|s| !s.contains(char::is_whitespace) && !s.contains('*') && !s.contains('<'))
        .map(|s| s.split(':').next().unwrap_or(s).trim_end_matches(['.', ',', ')']).to_owned())
        .collect()
}

#[test]
fn every_path_the_guides_name_exists() {
    let mut problems = Vec::new();
    for (rel, text) in documents() {
        for path in named_paths(&text) {
            if !root().join(&path).exists() {
                problems.push(format!("{} names `{path}`, which does not exist", rel.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        named_paths("see `src/a.rs:12`, `tests/vm/run --image 13`, `src/x/*.rs` and `cpupoolctl pool`"),
        vec!["src/a.rs".to_owned()]
    );
}
