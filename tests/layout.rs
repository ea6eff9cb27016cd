//! The guides to the code stay true to the tree: docs/development.md's layout names every
//! directory of the repository and of `src/` and only paths that exist, its floors are the
//! [`FLOORS`] held here, every bench and example is described and every file of dated figures
//! listed, and each module map of [`MODULE_MAPS`] names every module its file declares. The
//! code keeps to the floors (no import climbs, only the sandbox names `sim`, no new import loop
//! inside a folder) and to a shape a reader can take in: no production file over 700 lines of
//! code, no function over 80 lines unless a `// Long: <reason>` above it says why.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The first fenced block under "## Layout" of docs/development.md.
fn layout_block() -> String {
    let doc = read("docs/development.md");
    let section = &doc[doc.find("## Layout").unwrap_or_else(|| panic!("no Layout section"))..];
    let start = section.find("```\n").unwrap_or_else(|| panic!("no block")) + 4;
    let end = section[start..].find("```").unwrap_or_else(|| panic!("unclosed block"));
    section[start..start + end].to_owned()
}

#[test]
fn the_development_layout_names_every_source_directory_and_only_real_paths() {
    let block = layout_block();
    // The paths it names: each line's first word ending in `/`.
    let named: Vec<&str> =
        block.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.ends_with('/')).collect();
    assert!(named.len() >= 10, "{named:?}");
    for path in &named {
        assert!(root().join(path).is_dir(), "docs/development.md names `{path}`, which does not exist");
    }
    let mut dirs: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap_or_else(|e| panic!("src: {e}"))
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| format!("src/{}/", e.file_name().to_string_lossy()))
        .collect();
    // And every directory of the repository but the hidden ones and cargo's `target/`.
    dirs.extend(
        std::fs::read_dir(root())
            .unwrap_or_else(|e| panic!("{}: {e}", root().display()))
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .map(|e| format!("{}/", e.file_name().to_string_lossy()))
            .filter(|d| !d.starts_with('.') && d != "target/"),
    );
    dirs.sort();
    for dir in &dirs {
        assert!(named.contains(&dir.as_str()), "docs/development.md's layout does not name `{dir}`");
    }
}

/// The rooms of each floor as docs/development.md's numbered list under "## Layout" names them:
/// the backticked `NAME/` and `NAME.rs` of each item that are directories or files of `src/`.
fn documented_floors() -> Vec<Vec<String>> {
    let doc = read("docs/development.md");
    let section = &doc[doc.find("## Layout").unwrap_or_else(|| panic!("no Layout section"))..];
    let mut items: Vec<String> = Vec::new();
    for line in section.lines().skip(1).take_while(|l| !l.starts_with("```")) {
        let numbered = line.split_once(". ").is_some_and(|(n, _)| n.parse::<usize>().is_ok());
        if numbered {
            items.push(line.to_owned());
        } else if let Some(item) = items.last_mut().filter(|_| line.starts_with("   ")) {
            item.push_str(line);
        } else if !items.is_empty() {
            break;
        }
    }
    items
        .iter()
        .map(|item| {
            let mut rooms: Vec<String> = item
                .split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|w| {
                    if let Some((_, room)) = CRATES.iter().find(|(dir, _)| *dir == w) {
                        return Some((*room).to_owned());
                    }
                    let room = w.strip_suffix('/').or(w.strip_suffix(".rs"))?;
                    let exists = root().join("src").join(w).exists();
                    let house = HOUSES.contains(&room);
                    (exists && !house && room != "lib" && room != "main").then(|| room.replace('/', "::"))
                })
                .collect();
            rooms.sort();
            rooms.dedup();
            rooms
        })
        .collect()
}

#[test]
fn the_development_floors_are_the_floors_the_test_holds() {
    let documented = documented_floors();
    let held: Vec<Vec<String>> = FLOORS
        .iter()
        .map(|f| {
            let mut rooms: Vec<String> = f.iter().map(|r| (*r).to_owned()).collect();
            rooms.sort();
            rooms
        })
        .collect();
    assert_eq!(documented, held, "docs/development.md's floors, lowest first, against FLOORS");
}

/// `mod NAME;` lines of a file, `pub` or not (not `#[cfg(test)]` ones).
fn declared_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim();
        let l = ["pub(crate) ", "pub(super) ", "pub "].iter().fold(l, |r, p| r.strip_prefix(p).unwrap_or(r));
        let name = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';'));
        let test_only = i > 0 && lines[i - 1].trim().starts_with("#[cfg(test)]");
        if let Some(name) = name.filter(|_| !test_only && !name.is_some_and(|n| n.ends_with("tests"))) {
            out.push(name.to_owned());
        }
    }
    out
}

/// The files whose doc comment is a map of their folder's modules: each must name every module
/// the file declares (as `name`, [`name`], `name::`, name.rs, name/, or a line of a text block
/// that begins with the name). The other `mod.rs` files (api, config, core, host) describe their
/// room without a map of its modules.
const MODULE_MAPS: &[&str] = &[
    "src/engine/mod.rs",
    "src/sim/mod.rs",
    "src/kubernetes/mod.rs",
    "src/kubernetes/grpc/mod.rs",
    "src/kubernetes/deviceplugin/mod.rs",
    "src/kubernetes/nri/mod.rs",
    "src/kubernetes/cluster/mod.rs",
    "src/kubernetes/dra/mod.rs",
    "src/daemon.rs",
    "cpupoolctl/src/main.rs",
];

/// The modules `text` declares that its `//!` map does not name.
fn unmapped_modules(text: &str) -> Vec<String> {
    let doc: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let all = doc.join("\n");
    declared_modules(text)
        .into_iter()
        .filter(|m| {
            let named = [format!("`{m}`"), format!("`{m}::"), format!("{m}.rs"), format!("{m}/")]
                .iter()
                .any(|form| all.contains(form.as_str()))
                || doc.iter().any(|l| l.split_whitespace().next() == Some(m.as_str()));
            !named
        })
        .collect()
}

#[test]
fn every_module_map_names_every_module_of_its_file() {
    let mut problems = Vec::new();
    for rel in MODULE_MAPS {
        let text = read(rel);
        assert!(declared_modules(&text).len() >= 2, "{rel} declares no modules: take it off MODULE_MAPS");
        for m in unmapped_modules(&text) {
            problems.push(format!("{rel} declares `{m}` but its module map does not name it"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let map = "//! ```text\n//! proto   the APIs\n//! ```\n//! [`a`], `b::X`, c.rs and d/.\n";
    let mods = "mod a;\npub mod b;\nmod c;\nmod d;\npub(crate) mod proto;\nmod e;\n#[cfg(test)]\nmod f;\n";
    assert_eq!(unmapped_modules(&format!("{map}{mods}")), vec!["e".to_owned()]);
}

/// The production sources: the daemon's, the CLI's and the wire contract's `.rs` files,
/// without test modules (`tests.rs`, `*_tests.rs`, `tests/` directories).
fn production_sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let p = e.path();
            if p.is_dir() && e.file_name() != "tests" {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["src", "cpupoolctl/src", "cpupool-wire/src", "cpupool-core/src"] {
        walk(&root().join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter(|p| {
            p.file_name().is_some_and(|n| n != "tests.rs" && !n.to_string_lossy().ends_with("_tests.rs"))
        })
        .map(|p| {
            let rel = p.strip_prefix(root()).unwrap_or(&p).display().to_string();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
            (rel, without_test_items(&text))
        })
        .collect()
}

/// `text` without its test-only items: each `#[cfg(test)]` at the top level with the item it
/// guards (a `mod tests;` line, or a block down to its closing `}` at the top level). The whole
/// rest of the file counts, however far down a `mod tests;` line sits.
fn without_test_items(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].starts_with("#[") {
                j += 1;
            }
            i = if lines.get(j).is_some_and(|l| l.trim_end().ends_with(';')) {
                j + 1
            } else {
                (j..lines.len()).find(|&k| lines[k].trim_end() == "}").map_or(lines.len(), |k| k + 1)
            };
            continue;
        }
        out.push(lines[i]);
        i += 1;
    }
    out.join("\n")
}

#[test]
fn test_items_are_left_out_and_everything_else_counts() {
    let text = "use a;\n#[cfg(test)]\nmod tests;\nfn f() {\n}\n#[cfg(test)]\n#[allow(x)]\nmod t {\n    fn g() {\n    }\n}\nfn h() {}\n";
    assert_eq!(without_test_items(text), "use a;\nfn f() {\n}\nfn h() {}");
}

/// The functions of `code` longer than `max` lines that no `// Long: <reason>` comment
/// introduces (above the function, among its doc comments and attributes).
fn long_functions(code: &str, max: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let rest =
            ["pub ", "pub(crate) ", "pub(super) "].iter().fold(t, |r, p| r.strip_prefix(p).unwrap_or(r));
        let rest = ["async ", "const ", "unsafe "].iter().fold(rest, |r, p| r.strip_prefix(p).unwrap_or(r));
        let Some(sig) = rest.strip_prefix("fn ") else { continue };
        // A declaration (a trait's, a proxy's) ends its signature with `;`, a body opens `{`.
        let opens = lines[i..].iter().map(|l| l.trim_end()).find(|l| l.ends_with('{') || l.ends_with(';'));
        if !opens.is_some_and(|l| l.ends_with('{')) {
            continue;
        }
        let close = format!("{indent}}}");
        let Some(len) = lines[i..].iter().position(|l| l.trim_end() == close).map(|j| j + 1) else {
            continue;
        };
        let said = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let l = l.trim_start();
                l.starts_with("///") || l.starts_with("#[") || l.starts_with("//")
            })
            .any(|l| l.trim_start().starts_with("// Long: "));
        if len > max && !said {
            let name: String = sig.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.push((name, len));
        }
    }
    out
}

#[test]
fn production_files_stay_under_700_lines_and_functions_under_80_unless_they_say_why() {
    let mut problems = Vec::new();
    for (rel, code) in production_sources() {
        let n = code.lines().count();
        if n > 700 {
            problems.push(format!("{rel}: {n} lines of code (at most 700: split it along a seam)"));
        }
        for (name, len) in long_functions(&code, 80) {
            problems.push(format!(
                "{rel}: fn {name} is {len} lines (at most 80, or a `// Long: <reason>` above it)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_long_function_check_sees_what_it_should() {
    let body = "    x;\n".repeat(85);
    let long = format!("/// Doc.\npub(crate) async fn big() {{\n{body}}}\nfn small() {{\n}}\n");
    assert_eq!(long_functions(&long, 80), vec![("big".to_owned(), 87)]);
    let said =
        format!("// Long: one flat table of messages.\n/// Doc.\n#[allow(x)]\nfn big() {{\n{body}}}\n");
    assert!(long_functions(&said, 80).is_empty());
    let method = format!("impl A {{\n    fn m(&self) {{\n{body}    }}\n    fn decl(&self);\n}}\n");
    assert_eq!(long_functions(&method, 80), vec![("m".to_owned(), 87)]);
    let proxy = format!(
        "trait P {{\n    fn call(\n        &self,\n    ) -> u8;\n{}}}\n",
        "    fn x(&self);\n".repeat(90)
    );
    assert!(long_functions(&proxy, 80).is_empty());
}

/// The floors of `src/`, lowest first, as docs/development.md draws them: a room imports only
/// rooms on lower floors; on the ground floor, the helpers may use each other. `sim`, the
/// simulated kernel, stands beside `config` above `host` and is named only by the sandbox,
/// which the daemon's wiring chooses at start.
const FLOORS: &[&[&str]] = &[
    &["core", "counters", "logging", "threads", "backoff", "fds"],
    &["host"],
    &["config", "sim", "kubernetes::grpc", "kubernetes::cdi"],
    &["engine", "kubernetes::apiserver"],
    &[
        "api",
        "kubernetes::deviceplugin",
        "kubernetes::nri",
        "kubernetes::dra",
        "kubernetes::cluster",
        "reclaim",
    ],
    &["sandbox"],
    &["daemon"],
];

/// The floors' rooms that are crates of their own, by directory, and the name the daemon gives
/// each (`pub use cpupool_core as core`): the compiler keeps a crate below the daemon, and
/// [`the_core_crate_depends_on_nothing_that_does_io`] keeps what it may link short.
const CRATES: &[(&str, &str)] = &[("cpupool-core/", "core")];

/// The folders of `src/` that are homes of rooms rather than rooms: each of their modules is a
/// room of its own (`kubernetes::nri`), standing on its own floor; the home's `mod.rs` only
/// declares them.
const HOUSES: &[&str] = &["kubernetes"];

/// The room a module path stands in: its first segment, or its first two in a house.
fn room_of(path: &[String]) -> Option<String> {
    let first = path.first()?;
    match path.get(1) {
        Some(second) if HOUSES.contains(&first.as_str()) => Some(format!("{first}::{second}")),
        _ => Some(first.clone()),
    }
}

/// Who may name `sim`.
const SIM_USERS: &[&str] = &["sandbox"];

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
}

/// The module path of a file under `src/` (`src/host/store/load.rs` → `host::store::load`).
fn module_of(rel: &str) -> Vec<String> {
    let path = rel.strip_prefix("src/").unwrap_or(rel).trim_end_matches(".rs");
    let mut parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        parts.pop();
    }
    parts
}

/// The imports of production code that break the floors: `(file:line, message)`.
fn climbing_imports(files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (rel, code) in files.iter().filter(|(rel, _)| rel.starts_with("src/")) {
        let module = module_of(rel);
        let Some(room) = room_of(&module) else { continue };
        let Some(floor) = floor_of(&room) else {
            if room != "main" && !HOUSES.contains(&room.as_str()) {
                problems.push(format!("{rel}: `{room}` stands on no floor of tests/layout.rs's FLOORS"));
            }
            continue;
        };
        for (path, line) in paths_named(&module, code) {
            let Some(named) = room_of(&path) else { continue };
            if named == room {
                continue;
            }
            if named == "sim" && !SIM_USERS.contains(&room.as_str()) {
                problems.push(format!(
                    "{rel}:{line}: `{room}` names `sim` (only the sandbox chooses the simulated kernel)"
                ));
                continue;
            }
            // Items of the crate root itself (`crate::error_chain`) are everyone's.
            let Some(theirs) = floor_of(&named) else { continue };
            if theirs > floor || (theirs == floor && floor != 0) {
                problems.push(format!(
                    "{rel}:{line}: `{room}` (floor {floor}) imports `{named}` (floor {theirs}): imports go down only"
                ));
            }
        }
    }
    problems
}

#[test]
fn no_import_climbs_a_floor_and_only_the_sandbox_names_sim() {
    let problems = climbing_imports(&production_sources());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_floor_check_sees_what_it_should() {
    let file = |rel: &str, code: &str| vec![(rel.to_owned(), code.to_owned())];
    // Down is fine; up, sideways between adapters and `sim` outside the sandbox are not.
    assert!(climbing_imports(&file("src/engine/commit.rs", "use crate::host::x;\nuse super::ledger;\n"))
        .is_empty());
    assert_eq!(climbing_imports(&file("src/host/store.rs", "use crate::engine::Engine;\n")).len(), 1);
    assert_eq!(
        climbing_imports(&file(
            "src/kubernetes/nri/plugin.rs",
            "fn f() { crate::kubernetes::deviceplugin::x() }\n"
        ))
        .len(),
        1
    );
    // Inside a house, each room has its floor: an adapter may use the shared plumbing below it,
    // the plumbing may not use an adapter, nor the engine the adapters.
    assert!(climbing_imports(&file("src/kubernetes/nri/plugin.rs", "use super::super::grpc::clients;\n"))
        .is_empty());
    assert_eq!(
        climbing_imports(&file("src/kubernetes/grpc/clients.rs", "use super::super::nri::x;\n")).len(),
        1
    );
    assert_eq!(climbing_imports(&file("src/engine/claims.rs", "use crate::kubernetes::dra::x;\n")).len(), 1);
    assert_eq!(climbing_imports(&file("src/engine/drift.rs", "let f = crate::sim::cgroupfs();\n")).len(), 1);
    assert_eq!(
        climbing_imports(&file("src/kubernetes/cdi/spec.rs", "use super::super::super::api::x;\n")).len(),
        1
    );
    // Comments and test items are not code.
    let code = without_test_items(
        "/// See crate::engine.\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::sim::x;\n}\n",
    );
    assert!(climbing_imports(&file("src/host/sysfs.rs", &code)).is_empty());
    // Ground-floor helpers use each other.
    assert!(climbing_imports(&file("src/threads.rs", "use crate::counters::x;\n")).is_empty());
}

/// The `[[bench]]` names of Cargo.toml.
fn benches() -> Vec<String> {
    let toml = read("Cargo.toml");
    let mut names = Vec::new();
    let mut in_bench = false;
    for line in toml.lines() {
        if line.starts_with('[') {
            in_bench = line.trim() == "[[bench]]";
        } else if in_bench {
            if let Some(v) = line.strip_prefix("name = ") {
                names.push(v.trim_matches('"').to_owned());
            }
        }
    }
    names
}

#[test]
fn every_bench_and_example_is_described_where_the_guides_say() {
    let perf = read("docs/performance.md");
    let layout = layout_block();
    let benches = benches();
    assert!(benches.len() >= 10, "{benches:?}");
    for b in &benches {
        assert!(
            perf.contains(&format!("--bench {b}`")),
            "docs/performance.md's table does not describe `cargo bench --bench {b}`"
        );
        assert!(
            layout.contains(&format!(" {b} (")),
            "docs/development.md's benches/ line does not name `{b}`"
        );
    }
    for e in std::fs::read_dir(root().join("examples")).unwrap_or_else(|e| panic!("examples: {e}")).flatten()
    {
        let name = e.path().file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        assert!(
            layout.contains(&format!("{name}:")),
            "docs/development.md's examples/ line does not name `{name}`"
        );
    }
}

/// docs/performance.md's opening lists every file of dated figures in docs/benchmarks/, so a
/// session's figures are found from the guide.
#[test]
fn every_file_of_dated_figures_is_listed_in_docs_performance() {
    let perf = read("docs/performance.md");
    let index = &perf[..perf.find("## The benchmarks").unwrap_or_else(|| panic!("no `## The benchmarks`"))];
    let mut files: Vec<String> = std::fs::read_dir(root().join("docs/benchmarks"))
        .unwrap_or_else(|e| panic!("docs/benchmarks: {e}"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    let unlisted: Vec<&String> =
        files.iter().filter(|f| !index.contains(&format!("](benchmarks/{f})"))).collect();
    assert!(unlisted.is_empty(), "docs/performance.md's list of dated figures lacks {unlisted:?}");
}

/// The paths `code` names through `crate::`, `super::` and `self::`, resolved from the module
/// `module` to absolute segments (`use super::{a::X, b}` gives `a::X` and `b`, each under the
/// parent). Comment lines are left out; a path is cut at its first segment that is not an
/// identifier.
fn paths_named(module: &[String], code: &str) -> Vec<(Vec<String>, usize)> {
    // Comment lines are blanked, not dropped, so that a path's line number is the file's.
    let code: String = code
        .lines()
        .map(|l| if l.trim_start().starts_with("//") { "" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    let line_at = |i: usize| code[..i].matches('\n').count() + 1;
    let b = code.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b':');
        let rest = &code[i..];
        let (base, mut j): (Vec<String>, usize) = if starts && rest.starts_with("crate::") {
            (Vec::new(), 7)
        } else if starts && rest.starts_with("self::") {
            (module.to_vec(), 6)
        } else if starts && rest.starts_with("super::") {
            let mut ups = 0;
            let mut j = 0;
            while rest[j..].starts_with("super::") {
                ups += 1;
                j += 7;
            }
            (module[..module.len().saturating_sub(ups)].to_vec(), j)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // One path, or a `{...}` group of them.
        let read_path = |from: usize| -> (Vec<String>, usize) {
            let mut segs = Vec::new();
            let mut k = from;
            loop {
                let len = rest[k..].bytes().take_while(|&c| is_ident(c)).count();
                if len == 0 {
                    break;
                }
                segs.push(rest[k..k + len].to_owned());
                k += len;
                if rest[k..].starts_with("::") && rest[k + 2..].bytes().next().is_some_and(is_ident) {
                    k += 2;
                } else {
                    break;
                }
            }
            (segs, k)
        };
        if rest[j..].starts_with('{') {
            // Top-level items of the group, split at commas outside nested braces.
            let mut depth = 0;
            let mut item_start = j + 1;
            let mut k = j;
            while k < rest.len() {
                match rest.as_bytes()[k] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => {
                        let from =
                            item_start + rest[item_start..].len() - rest[item_start..].trim_start().len();
                        let (segs, _) = read_path(from);
                        out.push(([base.clone(), segs].concat(), line_at(i)));
                        item_start = k + 1;
                    }
                    _ => {}
                }
                k += 1;
            }
            let from = item_start + rest[item_start..].len() - rest[item_start..].trim_start().len();
            let (segs, _) = read_path(from.min(rest.len()));
            if !segs.is_empty() {
                out.push(([base.clone(), segs].concat(), line_at(i)));
            }
            j = k;
        } else {
            let (segs, k) = read_path(j);
            out.push(([base.clone(), segs].concat(), line_at(i)));
            j = k;
        }
        i += j.max(1);
    }
    out
}

/// Within each folder, the files (modules) that import one another in a loop: for every folder
/// with a loop, its files in the largest strongly connected set of sibling imports.
fn folder_loops(files: &[(String, String)]) -> std::collections::BTreeMap<String, Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let modules: Vec<(Vec<String>, &String)> =
        files.iter().map(|(rel, code)| (module_of(rel), code)).collect();
    let known: BTreeSet<&[String]> = modules.iter().map(|(m, _)| m.as_slice()).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, code) in &modules {
        let Some(parent) = m.split_last().map(|(_, p)| p) else { continue };
        for (path, _) in paths_named(m, code) {
            // The sibling the path goes through, when it names one of this folder's modules.
            if path.len() > parent.len() && path[..parent.len()] == *parent {
                let sibling = path[..=parent.len()].to_vec();
                if sibling != *m && known.contains(sibling.as_slice()) {
                    edges.entry(m.clone()).or_default().insert(sibling);
                }
            }
        }
    }
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(v) = stack.pop() {
            for w in edges.get(&v).into_iter().flatten() {
                if seen.insert(w.clone()) {
                    stack.push(w.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> =
        edges.keys().map(|v| (v.clone(), reach(v))).collect();
    let mut loops: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (v, r) in &reaches {
        if !r.contains(v) {
            continue;
        }
        let set: Vec<String> = r
            .iter()
            .filter(|w| reaches.get(*w).is_some_and(|rw| rw.contains(v)))
            .filter_map(|w| w.last().cloned())
            .collect();
        let folder = v[..v.len() - 1].join("/");
        let slot = loops.entry(folder).or_default();
        if set.len() > slot.len() {
            *slot = set;
        }
    }
    loops
}

/// No folder's files import one another in a loop: a loop inside a folder is one module split
/// across files, with nothing to say which file a change belongs in. The daemon's and the
/// core's folders are read each as their own crate (`crate::` is the crate's root).
#[test]
fn no_folder_has_an_import_loop() {
    let mut problems = Vec::new();
    let sources = production_sources();
    for dir in ["src/", "cpupool-core/src/"] {
        let files: Vec<(String, String)> = sources
            .iter()
            .filter_map(|(rel, code)| rel.strip_prefix(dir).map(|r| (format!("src/{r}"), code.clone())))
            .collect();
        assert!(files.len() >= 20, "{dir}: {} files", files.len());
        for (folder, files) in folder_loops(&files) {
            problems.push(format!("{dir}{folder}: an import loop between {files:?}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The ground floor does no I/O, reads no clock and awaits nothing. The compiler keeps the core
/// crate from naming the daemon; this keeps it from the rest: it may depend only on the wire
/// contract and on data libraries (no system-call, runtime, D-Bus, gRPC or Kubernetes
/// library), and its production code names none of the standard library's I/O, clock,
/// process, thread or environment modules.
#[test]
fn the_core_crate_depends_on_nothing_that_does_io() {
    const ALLOWED: &[&str] = &["cpupool-wire", "imbl", "serde", "serde_json", "thiserror"];
    let manifest: toml::Table =
        read("cpupool-core/Cargo.toml").parse().unwrap_or_else(|e| panic!("cpupool-core/Cargo.toml: {e}"));
    // The dependencies of every platform: `[dependencies]` and `[target.'cfg(…)'.dependencies]`.
    let targets = manifest.get("target").and_then(toml::Value::as_table).into_iter().flat_map(|t| t.values());
    let deps: Vec<&str> = std::iter::once(&manifest)
        .chain(targets.filter_map(toml::Value::as_table))
        .filter_map(|t| t.get("dependencies").and_then(toml::Value::as_table))
        .flat_map(|t| t.keys().map(String::as_str))
        .collect();
    assert!(deps.contains(&"serde"), "{deps:?}");
    let extra: Vec<&&str> = deps.iter().filter(|d| !ALLOWED.contains(d)).collect();
    assert!(extra.is_empty(), "cpupool-core depends on {extra:?}: the ground floor links no I/O");
    let core: Vec<(String, String)> =
        production_sources().into_iter().filter(|(rel, _)| rel.starts_with("cpupool-core/")).collect();
    assert!(core.len() >= 20, "{} core files", core.len());
    let mut found = Vec::new();
    for (rel, code) in &core {
        for (i, line) in code.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")) {
            found.extend(std_io_named(line).map(|m| format!("{rel}:{}: {m}", i + 1)));
        }
    }
    assert!(found.is_empty(), "the core names I/O:\n{}", found.join("\n"));
    assert_eq!(std_io_named("let t = std::time::Instant::now();").count(), 1);
    assert_eq!(std_io_named("use std::{fs, io::Write};").count(), 2);
    assert_eq!(std_io_named("use std::{collections::BTreeMap, fmt};").count(), 0);
    assert_eq!(std_io_named("use std::time::Duration; // std::fs").count(), 0);
}

/// The standard library's I/O, clock, process, thread and environment paths `line` names, as
/// `std::fs` or inside a `std::{...}` group.
fn std_io_named(line: &str) -> impl Iterator<Item = String> {
    const MODULES: &[&str] = &["fs", "io", "net", "os", "process", "thread", "env"];
    let code = line.split("//").next().unwrap_or("");
    let mut found: Vec<String> = MODULES
        .iter()
        .filter(|m| code.contains(&format!("std::{m}")))
        .map(|m| format!("std::{m}"))
        .chain(["Instant", "SystemTime"].iter().filter(|c| code.contains(*c)).map(|c| (*c).to_owned()))
        .collect();
    for group in code.split("std::{").skip(1) {
        let names = group.split([',', '{', '}', ' ']).map(|n| n.split("::").next().unwrap_or(""));
        found.extend(names.filter(|n| MODULES.contains(n)).map(|n| format!("std::{{{n}}}")));
    }
    found.into_iter()
}

#[test]
fn the_loop_check_sees_what_it_should() {
    let f = |rel: &str, code: &str| (rel.to_owned(), code.to_owned());
    let files = vec![
        f("src/x/mod.rs", "mod a;\nmod b;\nmod c;\n"),
        f("src/x/a.rs", "use super::{b::B, Opt};\n"),
        f("src/x/b.rs", "fn f() { crate::x::a::g() }\n"),
        f("src/x/c.rs", "use super::a;\n// use super::c;\n"),
    ];
    let loops = folder_loops(&files);
    assert_eq!(loops.get("x"), Some(&vec!["a".to_owned(), "b".to_owned()]), "{loops:?}");
    let no_loop = vec![f("src/x/a.rs", "use super::b;\n"), f("src/x/b.rs", "use super::Opt;\n")];
    assert!(folder_loops(&no_loop).is_empty());
}
